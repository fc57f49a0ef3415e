"""Tensors off the CPU are refused before anything is enqueued, with the
device named (docs/gpu.md: the device data path is not built yet). A CPU
torch cannot make a CUDA tensor; a meta tensor goes through the same check
(``tensor.device.type != "cpu"``), and where torch has CUDA and a GPU a real
one is tried too."""
import pytest

torch = pytest.importorskip("torch")
import kolo  # noqa: E402


def test_meta_tensor_refused():
    t = torch.empty(8, device="meta")
    with pytest.raises(TypeError, match=r"grad is on meta; this build of kolo takes CPU tensors"):
        kolo.buffer(t, "grad")


def test_cpu_tensor_accepted():
    t = torch.arange(8, dtype=torch.float32)
    b = kolo.buffer(t, "grad")
    assert b.count == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_cuda_tensor_refused():
    t = torch.ones(8, device="cuda")
    assert t.is_cuda
    with pytest.raises(TypeError, match=r"grad is on cuda:0; this build of kolo takes CPU"):
        kolo.buffer(t, "grad")
