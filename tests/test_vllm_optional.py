"""vLLM stays optional: ``import dspark_compile`` must not import it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dspark_compile_imports_without_vllm():
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # any 'import vllm' now raises
        "import dspark_compile, dspark_compile.integrations\n"
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules "
        "if sys.modules[m] is not None)\n"
        "try:\n"
        "    import dspark_compile_vllm\n"
        "except ImportError as err:\n"
        "    print('needs vllm:', err)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "needs vllm" in run.stdout
