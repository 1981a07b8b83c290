"""The GPU tests' skip condition: a Hopper (sm_90) GPU that torch can reach. CI has none."""


def has_hopper() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9
    except Exception:
        return False


def gpu_marks() -> list:
    """The GPU test files' pytestmark: marked gpu, and skipped with the reason where no Hopper GPU is."""
    import pytest

    return [pytest.mark.gpu, pytest.mark.skipif(not has_hopper(), reason="needs a CUDA GPU (Hopper sm_90); none here")]
