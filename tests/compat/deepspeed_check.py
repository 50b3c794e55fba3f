"""Re-measure what DeepSpeed makes of the corpus (not a test: it needs DeepSpeed).

    python tests/compat/deepspeed_check.py [--ds-python benchmarks/.ds-venv/bin/python]

Each config is filled as corpus_runner does (HF-style files through zerotrain's trainer
filler at its defaults), then parsed by DeepSpeed's own DeepSpeedConfig (world size 1) in
DeepSpeed's venv (benchmarks/compare_zero.py installs it). Prints one line per file whose
result differs from provenance.json, and the counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PARSE = """
import json, logging, os, sys
os.environ["DS_ACCELERATOR"] = "cpu"
logging.disable(logging.WARNING)
from deepspeed.runtime.config import DeepSpeedConfig
out = {}
for path in sys.argv[1:]:
    try:
        DeepSpeedConfig(json.load(open(path)))
        out[os.path.basename(path)] = "accepts"
    except BaseException as e:
        out[os.path.basename(path)] = "refuses: " + " ".join(str(e).split())[:110]
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ds-python", default=str(ROOT / "benchmarks" / ".ds-venv" / "bin" / "python"))
    args = parser.parse_args()
    sys.path[:0] = [str(HERE), str(ROOT / "src")]
    from corpus_runner import _has_auto, _through_trainer

    from zerotrain.config import read_config

    corpus = json.loads((HERE / "provenance.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for entry in corpus:
            source = str(HERE / "configs" / entry["file"])
            try:
                config = _through_trainer(source) if _has_auto(read_config(source)) else read_config(source)
            except Exception:  # zerotrain refuses it; let DeepSpeed see the file as written
                import hjson

                config = hjson.loads(Path(source).read_text(encoding="utf-8"))
            target = Path(folder) / entry["file"]
            target.write_text(json.dumps(config), encoding="utf-8")
            paths.append(str(target))
        result = subprocess.run([args.ds_python, "-c", PARSE, *paths], capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    for entry in corpus:
        listed = entry["deepspeed_0_19_8"]
        if listed.split(":")[0] != seen[entry["file"]].split(":")[0] and not listed.startswith("refuses at"):
            print(f"{entry['file']}: listed {listed[:50]!r}, measured {seen[entry['file']][:50]!r}")
    accepted = sum(v == "accepts" for v in seen.values())
    print(f"{len(seen)} configs: DeepSpeed's config parser accepts {accepted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
