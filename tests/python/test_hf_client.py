"""The transformers client (examples/python/hf_client.py) end to end: kvc dense mode gives
transformers' own greedy tokens, and block_select_exact reports its agreement. Needs torch,
transformers, gguf and the SmolLM2 GGUF (scripts/fetch-model); skipped otherwise (CI's venv has
none of them). On a CPU it takes minutes; on the GPU machine seconds."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = pathlib.Path(os.environ.get("KVC_MODEL_DIR", pathlib.Path.home() / ".cache/kvc"))
GGUF = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"


def have(*modules):
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def run_client(*extra):
    steps = os.environ.get("KVC_HF_STEPS", "16")
    run = subprocess.run([sys.executable, str(ROOT / "examples/python/hf_client.py"),
                          "--steps", steps, *extra], capture_output=True, text=True, timeout=1800)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, run.stdout + run.stderr
    report = json.loads(lines[-1])
    print(report)
    assert report["dense_identical"], report
    assert 0.0 <= report["block_select_top1_agreement"] <= 1.0
    assert run.returncode == 0


@pytest.mark.skipif(not have("torch", "transformers", "gguf") or not GGUF.exists(),
                    reason="needs torch, transformers, gguf and the SmolLM2 GGUF")
def test_smollm2_dense_mode_matches_transformers():
    run_client("--model-dir", str(MODEL_DIR))


@pytest.mark.skipif(not have("torch", "transformers"), reason="needs torch and transformers")
def test_random_llama_dense_mode_matches_transformers():
    run_client("--random-model")
