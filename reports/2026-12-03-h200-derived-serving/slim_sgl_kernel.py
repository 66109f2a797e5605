"""Write a copy of the sglang-kernel wheel without the libraries these runs never load.

The device takes at most 64 MiB a call; sglang-kernel 0.4.5 is 383 MB, 1.1 GB of it the FA3
library ``flash_ops`` (the ``fa3`` attention backend; these runs use ``flashinfer``). Left
out: ``sgl_kernel/flash_ops*.so`` (imported only by ``sgl_kernel.flash_attn``),
``flashmla_ops*.so`` and ``infllm_ops*.so`` (loaded lazily, MLA and InfLLM backends). Kept:
``sm90/`` and ``sm100/`` ``common_ops`` (``load_utils`` picks sm100 where no GPU is visible,
as in the launcher's selection run), everything else. RECORD loses the dropped lines.

Usage: python slim_sgl_kernel.py IN.whl OUT_DIR
"""

import sys
import zipfile
from pathlib import Path

DROP = ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops")


def main(source: str, out_dir: str) -> None:
    src = Path(source)
    out = Path(out_dir) / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED,
                                                      compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename.startswith(DROP):
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in data.decode().splitlines()
                         if not line.startswith(DROP)]
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    print(out, out.stat().st_size)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
