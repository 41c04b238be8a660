"""
Process layout: world = pp x dp x tp, held in one small object created once and passed
explicitly (no module-level globals). Without torchrun it is a single process
(dp=1; tensor parallelism, if any, is simulated inside the process).

The layout is data: MESH_DIMS names the dimensions from outermost to innermost, and the DeviceMesh is built
from the sizes of those in use (ParallelDims.mesh_dims): ("dp", "tp") without pipeline stages, ("pp", "dp",
"tp") with. Hybrid sharding (HSDP, data_parallel='fsdp' with dp_shard < dp) splits dp in two: ("dp_replicate",
"dp_shard", "tp"), FSDP sharding within a dp_shard group and replicating across the dp_replicate groups
(docs/fsdp.md); the two are flattened into one dp mesh (ParallelDims.dp_mesh) for what spans every replica:
batches, loss means, checkpoints.
"""

import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from tpcomm.errors import ConfigError

# outermost first: pipeline stages, data-parallel replicas, then the tensor-parallel shards of a layer
# (innermost, so a tp group is the ranks of one node). dp is one dim, or under HSDP the two dims dp_replicate
# x dp_shard: the shard group inner, so with dp_shard x tp = the GPUs of a node FSDP's all-gathers and
# reduce-scatters stay on the node and only the replicas' gradient all-reduce crosses nodes
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "dp", "tp")


@dataclass
class ParallelDims:
    dp: int = 1
    tp: int = 1  # size of the tensor-parallel *process* group (1 unless tp_mode='real')
    pp: int = 1  # pipeline stages
    rank: int = 0
    local_rank: int = 0
    # ranks of one FSDP shard group: dp (None) is FSDP, a divisor of dp < dp HSDP
    dp_shard: Optional[int] = None
    mesh: Optional[object] = None  # DeviceMesh with the dims of mesh_dims() when distributed
    dp_mesh: Optional[object] = None  # 1-D mesh of every dp rank (HSDP: dp_replicate x dp_shard flattened)
    embedding_group: Optional[object] = None  # pp > 1: the {first, last} pp rank of this (dp, tp) coordinate

    def __post_init__(self):
        if self.dp_shard is None:
            self.dp_shard = self.dp
        # check_dp_shard's
        assert self.dp_shard >= 1 and self.dp % self.dp_shard == 0, (self.dp, self.dp_shard)

    @property
    def dp_replicate(self):
        return self.dp // self.dp_shard

    @property
    def hsdp(self):
        return self.dp_shard < self.dp

    def mesh_dims(self):
        """[(name, size)] of the mesh, outermost first: dp (or dp_replicate and dp_shard) and tp always (so
        their groups exist even at size 1), pp only when used."""
        sizes = {"pp": self.pp, "tp": self.tp}
        sizes.update(dict(dp_replicate=self.dp_replicate, dp_shard=self.dp_shard) if self.hsdp
                     else dict(dp=self.dp))
        return [(name, sizes[name]) for name in MESH_DIMS if name in sizes and (name != "pp" or self.pp > 1)]

    @property
    def world_size(self):
        return self.dp * self.pp * self.tp

    @property
    def distributed(self):
        return self.world_size > 1

    @property
    def is_master(self):
        return self.rank == 0

    def _local_rank(self, dim):
        return self.mesh.get_local_rank(dim) if self.mesh is not None else 0

    def _group(self, dim):
        return self.mesh[dim].get_group() if self.mesh is not None else None

    @property
    def pp_rank(self):
        return self._local_rank("pp") if self.pp > 1 else 0

    @property
    def pp_group(self):
        return self._group("pp") if self.pp > 1 else None

    @property
    def dp_rank(self):
        """This rank's place among all dp ranks (HSDP: replica x dp_shard + shard), which keys its batches."""
        return self.dp_mesh.get_local_rank() if self.dp_mesh is not None else 0

    @property
    def tp_rank(self):
        return self._local_rank("tp")

    @property
    def dp_group(self):
        """Every dp rank (HSDP: all replicas' shards): the group of DDP, loss means and evaluation."""
        return self.dp_mesh.get_group() if self.dp_mesh is not None else None

    @property
    def fsdp_mesh(self):
        """The mesh fully_shard is given: 1-D dp (FSDP: sharded over every dp rank) or 2-D (dp_replicate,
        dp_shard) (HSDP: sharded within a dp_shard group, replicated across groups; gradients reduce-scattered
        within a group, then all-reduced across the replicas)."""
        return self.mesh["dp_replicate", "dp_shard"] if self.hsdp else self.dp_mesh

    @property
    def tp_group(self):
        return self._group("tp")


def launched_by_torchrun():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1


def check_layout(*, tp_size, tp_mode, pp_size=1):
    """Validate the launch before any work: returns (dp, tp) of the process grid world = pp_size x dp x tp
    (pipeline layouts are checked further by pipeline_config.validate_pp_layout)."""
    world = world_size()
    if tp_mode not in ("simulated", "real"):
        raise ConfigError(f"tp_mode must be 'simulated' or 'real', got {tp_mode!r}")
    tp = tp_size if tp_mode == "real" else 1
    if tp_mode == "real" and not launched_by_torchrun():
        raise ConfigError(f"tp_mode='real' needs torchrun with WORLD_SIZE a multiple of tp_size ({tp_size}); "
                          f"use e.g. torchrun --standalone --nproc_per_node={tp_size} ...")
    if world % (pp_size * tp):
        if pp_size > 1:
            raise ConfigError(f"world size ({world}) must equal pp_size ({pp_size}) x dp x tp ({tp}), but is "
                              "not " f"divisible by pp_size x tp ({pp_size * tp})")
        raise ConfigError(f"tp_mode='real': world size ({world}) must equal dp x tp_size, but is not "
                          "divisible by " f"tp_size ({tp_size})")
    return world // (pp_size * tp), tp


def check_dp_shard(dp_shard, *, data_parallel, dp=None):
    """dp_shard (HSDP's shard group size) against data_parallel and, once the launch is known, dp; returns the
    resolved size (None: dp, plain FSDP). Raises ConfigError naming the keys and values."""
    if dp_shard is None:
        return dp
    if isinstance(dp_shard, bool) or not isinstance(dp_shard, int) or dp_shard < 1:
        raise ConfigError(f"dp_shard must be a positive int (the ranks of one FSDP shard group) or None, "
                          f"got {dp_shard!r}")
    if data_parallel != "fsdp":
        raise ConfigError(f"dp_shard={dp_shard} needs data_parallel='fsdp' (hybrid sharding: FSDP within "
                          "groups of " f"dp_shard ranks, replicas across them), got "
                          f"data_parallel={data_parallel!r}")
    if dp is not None and dp % dp_shard:
        raise ConfigError(f"dp_shard ({dp_shard}) must divide the number of data-parallel ranks dp ({dp}): "
                          f"dp_replicate = dp / dp_shard replicas of dp_shard ranks each")
    return dp_shard


def check_backend(backend):
    """None (nccl on CUDA, gloo elsewhere), 'nccl' (checked against the device when the group starts) or
    another torch.distributed backend this build of torch has: a single process never starts a group, so a
    name it cannot use would otherwise pass unnoticed."""
    if backend is None or backend == "nccl":
        return
    if not isinstance(backend, str) or not dist.is_available() or not dist.is_backend_available(backend):
        raise ConfigError(f"backend={backend!r} is not a torch.distributed backend this torch has; leave it "
                          "None " f"(nccl on CUDA, gloo elsewhere) or give 'gloo' or 'nccl'")


def init_parallel(*, dp, tp, pp=1, dp_shard=None, device_type, backend=None):
    """Start torch.distributed if under torchrun and build the DeviceMesh of the layout (and, with pipeline
    stages, the embedding groups). dp_shard < dp: HSDP's mesh (see MESH_DIMS). May be called again with
    another layout of the same world (tests do)."""
    layout = ParallelDims(dp=dp, tp=tp, pp=pp, dp_shard=dp_shard)
    if layout.world_size == 1 and not launched_by_torchrun():
        return layout
    from torch.distributed.device_mesh import init_device_mesh

    backend = backend or ("nccl" if device_type == "cuda" else "gloo")
    # found here, on every rank alike, not as a hang or a traceback
    if backend == "nccl" and device_type != "cuda":
        raise ConfigError(f"backend='nccl' needs CUDA devices, but the device is {device_type!r}; use "
                          "--backend=gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    names, sizes = zip(*layout.mesh_dims())
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    # HSDP: one mesh over both dp dims, row-major, so dp_rank = replica x dp_shard + shard (FSDP's dp ranks,
    # the same batches). DeviceMesh has no public flatten in torch 2.13 (torchtitan uses _flatten too);
    # slicing the flattened dim from the root mesh is deprecated, so the flattened mesh is kept here
    dp_mesh = mesh["dp_replicate", "dp_shard"]._flatten("dp") if layout.hsdp else mesh["dp"]
    rank, embedding_group = dist.get_rank(), None
    if pp > 1:  # every rank creates every group (new_group is collective) and keeps its own
        for d in range(dp):
            for t in range(tp):
                ranks = [p * dp * tp + d * tp + t for p in (0, pp - 1)]  # row-major (pp, dp, tp)
                group = dist.new_group(ranks)
                if rank in ranks:
                    embedding_group = group
    return ParallelDims(dp=dp, tp=tp, pp=pp, dp_shard=dp_shard, rank=rank, local_rank=local_rank, mesh=mesh,
                        dp_mesh=dp_mesh, embedding_group=embedding_group)


def shutdown(pd, *, finished=False):
    """Tear the process groups down. finished=True (every rank got to the end of its work): first a barrier,
    so no rank destroys its groups while another still completes a collective (without it, FSDP runs on gloo
    sometimes died at exit with 'terminate called without an active exception'). After an error there is no
    barrier: the other ranks may be inside a collective that would never match it."""
    if pd.mesh is not None and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
