"""One release's files out of its PyPI wheel, for the golden generators in
tools/ (sglang_tables.py, sglang_eplb.py, vllm_eplb.py), which then run the
release's own code.

    extract(package, version, dest, keep)
        pip-downloads package==version (the wheel alone, no dependencies) and
        writes each member name for which keep(name) returns a relative path
        to dest/version/<that path>; keep returns None to skip a member.
"""
import glob
import os
import subprocess
import sys
import tempfile
import zipfile


def extract(package, version, dest, keep):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"{package}=={version}", "-d", tmp], check=True)
        (whl,) = glob.glob(os.path.join(tmp, "*.whl"))
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                rel = keep(name)
                if rel is None:
                    continue
                out = os.path.join(dest, version, rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(z.read(name))
