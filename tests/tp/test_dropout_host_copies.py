"""Keyed dropout moves nothing from the host per step: DropoutKey.set writes the key with
fill_ kernels and keep_mask computes its salts on the device, so on CUDA neither a pageable
host-to-device copy (which synchronizes the host with the device) nor a tensor built from a Python list
runs per micro-step or per mask.

No GPU here: the 'meta' device stands in for CUDA. Every op run while keying and drawing masks is
recorded by a TorchDispatchMode; any tensor on the CPU among its inputs or outputs is a host tensor that
would have to be copied to the device. The masks are those of the list-built salts (compared bitwise with
the formula's reference)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tpcomm.tp.dropout import M32, DropoutKey, _digest, _mix32, _salt, _salts, keep_mask


class HostTensors(TorchDispatchMode):
    """Records the ops that touch a CPU tensor (a host-to-device copy's source, a list made into a tensor)."""

    def __init__(self):
        super().__init__()
        self.host_ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten((args, kwargs, out))
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in flat):
            self.host_ops.append(str(func))
        return out


def reference_mask(shape, p, key, *, layer, site, streams, offset=0):
    """keep_mask as it was written before: salts from a Python list."""
    S = len(streams)
    part = (shape[0] // S, *shape[1:])
    salts = torch.tensor([_salt(layer, site, s) for s in streams], dtype=torch.int64)
    k0 = _mix32(key[0] ^ salts).view(S, *[1] * len(part))
    i = torch.arange(torch.Size(part).numel(), dtype=torch.int64).view(1, *part) + offset
    h = _mix32(_mix32((i & M32) ^ k0) ^ key[1] ^ (i >> 32))
    return ((h >> 8) >= int(p * (1 << 24))).to(torch.float32).div_(1.0 - p).view(shape)


def test_no_host_tensor_per_step_or_mask(monkeypatch):
    # torch.tensor(data, device=...) builds its CPU tensor below the dispatcher: counted by patching it
    made = []
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **kw: made.append(a) or real_tensor(*a, **kw))
    key = DropoutKey()
    key.set((1337, 0, 0), "meta")  # the first call allocates the device tensor (no host data either)
    with HostTensors() as mode:
        for it in range(3):  # micro-steps: keyed again, masks drawn
            key.set((1337, it, 1), "meta")
            keep_mask((4, 8, 16), 0.1, key.tensor, layer=2, site=1, streams=(1, 2, 3, 4), device="meta",
                      offset=32)
            keep_mask((8, 16), 0.1, key.tensor, layer=2, site=2, streams=(0,), device="meta")
    assert mode.host_ops == [] and made == []


def test_detector_sees_a_host_copy():
    """Anti-vacuity: the old set() (a CPU tensor copied in) and a list-built tensor are seen."""
    dev = torch.empty(2, dtype=torch.int64, device="meta")
    with HostTensors() as mode:
        dev.copy_(torch.tensor([1, 2], dtype=torch.int64))
    assert mode.host_ops
    with HostTensors() as mode:
        torch.tensor([1, 2], dtype=torch.int64).to("meta")
    assert mode.host_ops


def test_key_and_masks_unchanged():
    """The key's halves and every mask bit equal the list-built reference (exact: integer hashing)."""
    key = DropoutKey()
    for it in range(3):
        key.set((7, it, 2), "cpu")
        d = _digest(7, it, 2)
        assert key.tensor.tolist() == [d & M32, d >> 32]
        for streams in [(0,), (1, 2), (3, 4, 5, 6)]:
            for layer, site in [(-1, 3), (0, 0), (5, 2)]:
                assert _salts(layer, site, streams, "cpu").tolist() == [_salt(layer, site, s)
                                                                        for s in streams]
                shape = (2 * len(streams), 5, 8)
                got = keep_mask(shape, 0.2, key.tensor, layer=layer, site=site, streams=streams, device="cpu",
                                offset=40)
                want = reference_mask(shape, 0.2, key.tensor, layer=layer, site=site, streams=streams,
                                      offset=40)
                assert torch.equal(got, want)
    key.set((), "cpu")
    assert key.tensor is None  # unkeyed: torch's global RNG
