"""Image stage: the runtime OCI image, upstream's image by digest plus our wheels.

:func:`~builder.image.run.run_image` builds the target's wheel(s) and then the image
(:func:`~builder.image.build.build_image`, BuildKit through the Docker Engine).
"""

from builder.image.build import ImageResult, build_image
from builder.image.run import ImageOptions, run_image

__all__ = ["ImageOptions", "ImageResult", "build_image", "run_image"]
