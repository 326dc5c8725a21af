"""examples/moe_layer_ep.py: the MoE layer through the EP exchange equals the
dense layer. Here in its emulated form (one CPU process, the exchange by the
plain-torch definition epx's engine is tested against); the GPU form runs the
same code through epx.torch.Buffer (scripts/gpu_check.sh)."""
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "moe_layer_ep.py"


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("moe_layer_ep", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_emulated_layer_equals_dense(ex, ranks, capsys):
    assert ex.main(["--ranks", str(ranks), "--experts", "12", "--emulate"]) == 0
    assert "largest difference" in capsys.readouterr().out


def test_a_misrouted_row_is_caught(ex, monkeypatch):
    """The check can fail: outputs returned to the wrong token are seen."""
    real = ex.run_experts

    def shifted(layer, rank, recv_x, recv_count):
        y = real(layer, rank, recv_x, recv_count)
        return torch.roll(y, shifts=1, dims=1)  # every expert's rows one place off

    monkeypatch.setattr(ex, "run_experts", shifted)
    assert ex.main(["--ranks", "2", "--experts", "8", "--emulate"]) == 1


def test_bad_arguments_are_refused(ex):
    with pytest.raises(SystemExit):
        ex.main(["--ranks", "3", "--experts", "8", "--emulate"])
