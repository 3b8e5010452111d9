# Owner(s): ["module: dynamo"]
"""Compile packages under torch.distributed: DDP, FSDP2 and ranks sharing one package.

Every case runs real ranks: this file, started again as a worker
(``python test_package_distributed.py --worker PHASE ...``) once per rank, two
ranks on the gloo backend joined through a file store, a timeout on every
collective and on the processes. A package is saved by one set of processes
and loaded by a FRESH set with an empty TORCHINDUCTOR_CACHE_DIR under
torch.compiler.set_stance("fail_on_recompile"); outputs and gradients are
compared, on every rank, with the same model run eagerly under the same
wrapper (DDP or fully_shard). A DDP model compiled with Inductor trains from
its package bitwise as it trained when it compiled (NOTE: [Bitwise-equal DDP
training from a package]), and from rank 0's package on every rank: no graph
holds a collective or a rank's value (NOTE: [One package serves every rank
under DDP]).
"""

import copy
import datetime
import gc
import io
import os
import pickle
import stat
import sys
import tempfile
import unittest
from pathlib import Path

import torch
import torch._dynamo.test_case
import torch.distributed as dist
from torch.testing._internal.common_utils import instantiate_parametrized_tests, slowTest
from torch.testing._internal.fresh_process import rank_worker_main, run_ranks


WORLD_SIZE = 2
# The long tail (the nightly): the Inductor DDP case on 4 ranks too.
# Seconds: any one collective, and one phase of all ranks.
COLLECTIVE_TIMEOUT_S = 60
PHASE_TIMEOUT_S = 240
PACKAGE = "ddp_net"
# How generated code or an FX target calling a collective spells it. (Not the
# bare "c10d": Inductor's wrapper preamble names
# torch._C._distributed_c10d._SymmetricMemory on every graph.)
_COLLECTIVES = ("_c10d_functional", "ops.c10d", "all_gather", "reduce_scatter", "all_reduce", "wait_tensor")


class _Net(torch.nn.Module):
    """Four layers of 1 MiB parameters: with 1 MiB buckets (DDPOptimizer's
    smallest: its first bucket is 1 MiB), DDPOptimizer splits it in pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


# ---------------------------------------------------------------------------
# Worker side (one process per rank)
# ---------------------------------------------------------------------------


def _init_rank(args: dict) -> int:
    rank = int(args["rank"])
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args['store']}",
        rank=rank,
        world_size=int(args.get("world_size", WORLD_SIZE)),
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    return rank


def _batch(rank: int, step: int) -> torch.Tensor:
    # Different data on every rank: gradients agree only through the allreduce.
    return torch.randn(4, 512, generator=torch.Generator().manual_seed(100 * step + rank))


def _ddp_step(model, x):
    out = model(x)
    out.sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return out.detach(), grads


def _wrap_ddp(net):
    from torch.nn.parallel import DistributedDataParallel

    # 1 MiB buckets: about one per layer, so DDPOptimizer splits the graph.
    return DistributedDataParallel(net, bucket_cap_mb=1)


def _compare(step, compiled, eager) -> None:
    torch.testing.assert_close(compiled[0], eager[0], msg=f"outputs of step {step}")
    for i, (g, e) in enumerate(zip(compiled[1], eager[1])):
        torch.testing.assert_close(g, e, msg=f"gradient {i} of step {step}")


def _worker_ddp(args: dict) -> dict:
    rank = _init_rank(args)
    torch.manual_seed(0)
    net = _Net()
    eager = _wrap_ddp(copy.deepcopy(net))
    compiled = torch.compile(_wrap_ddp(net), backend=args["backend"], package=PACKAGE)
    result: dict = {"rank": rank}
    if args["phase"] == "save":
        for step in range(2):
            _compare(step, _ddp_step(compiled, _batch(rank, step)), _ddp_step(eager, _batch(rank, step)))
        package = compiled._compile_package()
        result["ddp_split_graphs"] = sum(
            record.backend == "custom:ddp_optimizer"
            for _, record in package.backend.records.values()
        )
        # Every rank saves its own package; rank 0 also the one all ranks load.
        compiled.save_package(prefix=os.path.join(args["prefix"], f"rank{rank}"))
        if rank == 0:
            compiled.save_package(prefix=os.path.join(args["prefix"], "shared"))
        result["left_out"] = list(package._unsaveable)
    else:
        dist.barrier()  # every rank loads the shared package at once
        compiled.load_package(prefix=os.path.join(args["prefix"], "shared"))
        with torch.compiler.set_stance("fail_on_recompile"):
            for step in range(2):
                _compare(step, _ddp_step(compiled, _batch(rank, step)), _ddp_step(eager, _batch(rank, step)))
        result["entries"] = len(compiled._compile_package()._loaded)
    dist.barrier()
    return result


# NOTE: [Bitwise-equal DDP training from a package]
# The Inductor DDP case trains TRAIN_STEPS steps of SGD three times, in fresh
# ranks each time: once compiling cold (an empty Inductor cache), saving each
# rank's package after the run, and then from the packages under
# fail_on_recompile, twice: every rank from its own package, and every rank
# from rank 0's (NOTE: [One package serves every rank under DDP]).
# Same seeds, same batches, one OpenMP thread and the same compiled kernels
# (the package's): every step's loss and the final parameters must be
# bitwise equal (torch.equal), not merely close. The cold run writes its
# losses and parameters next to the package for the loading run to compare.
TRAIN_STEPS = 20


def _train(model, rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        loss = model(_batch(rank, step)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in model.parameters()]


def _split_pieces(package) -> list:
    """The pieces (_GraphRecords) of every DDPOptimizer split graph the package recorded."""
    splits = {
        id(record): record
        for _, record in package.backend.records.values()
        if record.backend == "custom:ddp_optimizer"
    }
    return [piece for record in splits.values() for piece, _ in record.compiled.pieces.values()]


def _worker_ddp_train(args: dict) -> dict:
    rank = _init_rank(args)
    torch.manual_seed(0)
    compiled = torch.compile(_wrap_ddp(_Net()), backend="inductor", package=PACKAGE)
    # A loading rank reads its own package, or the one rank 0 saved
    # (NOTE: [One package serves every rank under DDP]).
    source = args.get("load_from")
    prefix = os.path.join(args["prefix"], f"rank{rank if source is None else source}")
    run = os.path.join(args["prefix"], f"cold_run_rank{rank}.pt")
    result: dict = {"rank": rank}
    if args["phase"] == "save":
        initial = [p.detach().clone() for p in compiled.parameters()]
        losses, params = _train(compiled, rank)
        result["params_moved"] = all(not torch.equal(a, b) for a, b in zip(params, initial))
        package = compiled._compile_package()
        pieces = _split_pieces(package)
        result["pieces"] = len(pieces)
        result["pieces_with_entries"] = sum(
            p.backend == "inductor" and p.aot_entry is not None and p.aot_entry.compiled_bw is not None
            for p in pieces
        )
        compiled.save_package(prefix=prefix)
        result["left_out"] = list(package._unsaveable)
        torch.save({"losses": losses, "params": params}, run)
    else:
        compiled.load_package(prefix=prefix)
        with torch.compiler.set_stance("fail_on_recompile"):
            losses, params = _train(compiled, rank)
        cold = torch.load(run)
        result["entries"] = len(compiled._compile_package()._loaded)
        result["losses_equal"] = [torch.equal(a, b) for a, b in zip(losses, cold["losses"])]
        result["params_equal"] = [torch.equal(a, b) for a, b in zip(params, cold["params"])]
        # The steps ran the package's Inductor pieces (rebuilt at their first call).
        from torch._dynamo.package import _DDPSplitPiece
        from torch._dynamo.package_artifacts import _PackagedInductorGraph

        result["pieces_run"] = sum(
            isinstance(obj, _DDPSplitPiece)
            and isinstance(obj.compiled, _PackagedInductorGraph)
            and obj.compiled.compiled is not None
            for obj in gc.get_objects()
        )
    dist.barrier()
    return result


def _worker_fsdp2(args: dict) -> dict:
    from torch.distributed.fsdp import fully_shard

    rank = _init_rank(args)

    def sharded():
        torch.manual_seed(0)
        net = _Net()
        for layer in net.layers:
            fully_shard(layer)
        return fully_shard(net)

    eager = sharded()
    compiled = torch.compile(
        sharded(),
        backend="aot_eager",
        package="fsdp2_net",
    )
    prefix = os.path.join(args["prefix"], f"rank{rank}")
    result: dict = {"rank": rank}
    if args["phase"] == "load":
        compiled.load_package(prefix=prefix)
    stance = "fail_on_recompile" if args["phase"] == "load" else "default"
    with torch.compiler.set_stance(stance):
        for step in range(2):
            _compare(step, _ddp_step(compiled, _batch(rank, step)), _ddp_step(eager, _batch(rank, step)))
    if args["phase"] == "save":
        compiled.save_package(prefix=prefix)
        result["left_out"] = list(compiled._compile_package()._unsaveable)
    else:
        result["entries"] = len(compiled._compile_package()._loaded)
    dist.barrier()
    return result


def _dtensor_fn(t):
    return (torch.relu(t) * 2).sum(dim=1)


def _worker_dtensor(args: dict) -> dict:
    from torch._dynamo.guard_serialization_codecs import _DTensorSpecCodec, _Hydrator
    from torch.distributed.tensor import distribute_tensor, init_device_mesh, Replicate, Shard

    rank = _init_rank(args)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    full = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    x = distribute_tensor(full, mesh, [Shard(0)])
    compiled = torch.compile(_dtensor_fn, backend="aot_eager", package="dtensor_fn")
    prefix = os.path.join(args["prefix"], f"rank{rank}")
    result: dict = {"rank": rank}
    if args["phase"] == "save":
        out = compiled(x)
        compiled.save_package(prefix=prefix)
        result["left_out"] = list(compiled._package._unsaveable)
    else:
        compiled.load_package(prefix=prefix)
        with torch.compiler.set_stance("fail_on_recompile"):
            out = compiled(x)
            # The placements are guarded by value: Replicate is another program.
            try:
                compiled(distribute_tensor(full, mesh, [Replicate()]))
                result["replicate_recompiled"] = False
            except RuntimeError as e:
                result["replicate_recompiled"] = "fail_on_recompile" in str(e)
        result["entries"] = len(compiled._package._loaded)
        # The mesh a loaded guard holds is bound to this process's live group.
        spec = _Hydrator()(_DTensorSpecCodec.save(None, x._spec, "x", True))
        total = torch.ones(1)
        dist.all_reduce(total, group=spec.mesh.get_group())
        result["rebound_group_sum"] = total.item()
    torch.testing.assert_close(out.full_tensor(), _dtensor_fn(full))
    dist.barrier()
    return result


_WORKERS = {
    "ddp": _worker_ddp,
    "ddp_train": _worker_ddp_train,
    "fsdp2": _worker_fsdp2,
    "dtensor": _worker_dtensor,
}


def _worker_main(argv: list[str]) -> None:
    # Every worker ends on a barrier, so its result is final when it leaves
    # (NOTE: [Ranks in fresh processes]).
    rank_worker_main(argv, lambda args: _WORKERS[args["case"]](args))


# ---------------------------------------------------------------------------
# Test side
# ---------------------------------------------------------------------------


def _run_ranks(case: str, phase: str, workdir: Path, world_size: int = WORLD_SIZE, **args) -> list[dict]:
    """Run ``case``'s ``phase`` on ``world_size`` fresh processes; their results."""
    return run_ranks(__file__, workdir, world_size, PHASE_TIMEOUT_S, case=case, phase=phase, **args)


# NOTE: [One package serves every rank under DDP]
# DDP's communication is not in any graph: the allreduce of each bucket is
# started by the C++ Reducer (torch/csrc/distributed/c10d/reducer.cpp) from
# autograd hooks on the parameters' gradient accumulators, outside the
# compiled frame, and DDPOptimizer only cuts the graph at bucket boundaries so
# that each piece's backward finishes (and its hooks fire) early. So the split
# graph calls only its pieces, the pieces' Inductor code calls no collective
# (no _c10d_functional or c10d op), and nothing a graph computes depends on the
# rank: the rank reaches the step only as data (each rank's batch) and through
# the Reducer's process group. The ranks' packages hold the same code: the
# split graph's and every piece's forward and backward are equal text, which
# they could not be if a rank's value were a constant in any of them. The
# frame's guards, too, check nothing rank-specific: rank 1 runs rank 0's
# package under fail_on_recompile. So on CPU one rank's package serves every
# rank, and the test loads both ways: each rank its own package, then every
# rank rank 0's; both train bitwise as each rank's cold run did. (On CUDA the
# device index is in the guards and in Inductor's code: save per rank there.
# Not tested: no multi-GPU machine.) A rank's value the model's own code
# traces (dist.get_rank(), dist.get_world_size()) is folded with a guard, so
# another rank recompiles (test_package_rank_values.py); ProcessGroup.rank()
# still folds unguarded (docs/packages.md, "Compile once for every rank").


def _saved_split_graphs(package_dir: Path) -> list[dict]:
    """What each DDPOptimizer split graph saved in a package holds: its pieces'
    Inductor graphs (forward and backward), its kernel binaries, the code of
    the split graph and of every piece, and the collectives any of them call."""
    from torch._dynamo.package_trust import load_graph_pickle

    found = []
    for path in sorted((package_dir / "graphs").glob("*.bin")):
        data = path.read_bytes()
        if data.startswith(b"PK"):
            continue  # a torch.save archive: an Inductor graph of its own
        graph = pickle.loads(data)
        if graph.get("backend") != "custom:ddp_optimizer":
            continue
        split = pickle.loads(graph["artifacts"])
        pieces = [torch.load(io.BytesIO(blob), weights_only=False) for blob in split["pieces"].values()]
        code = {"split graph": split["outer"].code}
        targets = [str(node.target) for node in split["outer"].graph.nodes]
        for name, piece in zip(split["pieces"], pieces):
            for field in ("fw_graph", "bw_graph"):
                code[f"{name} {field}"] = load_graph_pickle(piece[field], field).source_code
        found.append(
            {
                "code": code,
                "collectives": sorted(
                    {op for text in (*code.values(), *targets) for op in _COLLECTIVES if op in text}
                ),
                "pieces": len(pieces),
                "inductor_fw_and_bw": sum(
                    p["backend"] == "inductor" and p["fw_graph"] is not None and p["bw_graph"] is not None
                    for p in pieces
                ),
                "kernels": len(split["kernels"]),
            }
        )
    return found


def _read_only_tree(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR)
        os.chmod(dirpath, stat.S_IRUSR | stat.S_IXUSR)


def _writable_tree(root: Path) -> None:
    for dirpath, _, _ in os.walk(root, followlinks=False):
        os.chmod(dirpath, stat.S_IRWXU)


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "needs torch.distributed with gloo")
class TestPackageDistributed(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.workdir = Path(tempfile.mkdtemp(prefix="test_package_distributed_"))

    def tearDown(self):
        _writable_tree(self.workdir)
        import shutil

        shutil.rmtree(self.workdir, ignore_errors=True)
        super().tearDown()

    # NOTE: aot_eager, for speed: the Inductor pieces of a DDP model are
    # test_ddp_inductor_training_from_package_is_bitwise_equal's.
    def test_ddp_save_on_every_rank_load_shared_read_only(self):
        prefix = self.workdir / "packages"
        saved = _run_ranks("ddp", "save", self.workdir, backend="aot_eager", prefix=str(prefix))
        # DDPOptimizer split the graph (1 MiB buckets) and the package recorded
        # the split graph; nothing was left out.
        self.assertTrue(all(r["ddp_split_graphs"] >= 1 for r in saved), saved)
        self.assertEqual([r["left_out"] for r in saved], [[]] * WORLD_SIZE)
        for rank in range(WORLD_SIZE):
            self.assertTrue((prefix / f"rank{rank}" / PACKAGE / "manifest.json").is_file())
        shared = prefix / "shared"
        before = sorted(str(p.relative_to(shared)) for p in shared.rglob("*"))
        # Loading writes nothing into the package and takes no lock.
        _read_only_tree(shared)
        loaded = _run_ranks("ddp", "load", self.workdir, backend="aot_eager", prefix=str(prefix))
        self.assertTrue(all(r["entries"] >= 1 for r in loaded), loaded)
        self.assertEqual(sorted(str(p.relative_to(shared)) for p in shared.rglob("*")), before)

    def test_ddp_inductor_training_from_package_is_bitwise_equal(self):
        self._check_ddp_inductor_training(WORLD_SIZE)

    @slowTest
    def test_ddp_inductor_training_from_package_is_bitwise_equal_4_ranks(self):
        self._check_ddp_inductor_training(4)

    def _check_ddp_inductor_training(self, world_size: int) -> None:
        # See NOTE: [Bitwise-equal DDP training from a package]
        prefix = str(self.workdir / "ddp_inductor")
        saved = _run_ranks("ddp_train", "save", self.workdir, world_size, prefix=prefix)
        self.assertEqual(len(saved), world_size)
        for r in saved:
            # DDPOptimizer split the graph, and every piece was compiled by
            # Inductor with a forward and a backward the package saved.
            self.assertGreaterEqual(r["pieces"], 2, r)
            self.assertEqual(r["pieces_with_entries"], r["pieces"], r)
            self.assertEqual(r["left_out"], [], r)
            self.assertTrue(r["params_moved"], r)  # it trained
        splits = []
        for rank in range(world_size):
            (split,) = _saved_split_graphs(self.workdir / "ddp_inductor" / f"rank{rank}" / PACKAGE)
            counts = {k: v for k, v in split.items() if k != "code"}
            self.assertEqual(split["pieces"], saved[rank]["pieces"], counts)
            self.assertEqual(split["inductor_fw_and_bw"], split["pieces"], counts)
            self.assertGreaterEqual(split["kernels"], 1, counts)
            # NOTE: [One package serves every rank under DDP]
            self.assertEqual(split["collectives"], [], f"rank {rank}")
            splits.append(split)
        for rank, split in enumerate(splits[1:], start=1):
            for name, code in splits[0]["code"].items():
                self.assertEqual(split["code"].get(name), code, f"rank {rank}'s {name} against rank 0's")
        # Each rank its own package, then every rank rank 0's.
        for load_from in (None, 0):
            loaded = _run_ranks("ddp_train", "load", self.workdir, world_size, prefix=prefix, load_from=load_from)
            for r in loaded:
                where = {"loaded package of rank": load_from, **r}
                self.assertGreaterEqual(r["entries"], 1, where)
                self.assertEqual(r["pieces_run"], saved[r["rank"]]["pieces"], where)
                self.assertEqual(r["losses_equal"], [True] * TRAIN_STEPS, where)
                self.assertEqual(r["params_equal"], [True] * len(r["params_equal"]), where)

    def test_fsdp2_save_and_load_on_every_rank(self):
        prefix = str(self.workdir / "fsdp2")
        saved = _run_ranks("fsdp2", "save", self.workdir, prefix=prefix)
        self.assertEqual([r["left_out"] for r in saved], [[]] * WORLD_SIZE, saved)
        loaded = _run_ranks("fsdp2", "load", self.workdir, prefix=prefix)
        self.assertTrue(all(r["entries"] >= 1 for r in loaded), loaded)

    def test_dtensor_guards_save_and_load(self):
        prefix = str(self.workdir / "dtensor")
        saved = _run_ranks("dtensor", "save", self.workdir, prefix=prefix)
        self.assertEqual([r["left_out"] for r in saved], [[]] * WORLD_SIZE)
        loaded = _run_ranks("dtensor", "load", self.workdir, prefix=prefix)
        for r in loaded:
            self.assertGreaterEqual(r["entries"], 1)
            self.assertTrue(r["replicate_recompiled"], r)
            self.assertEqual(r["rebound_group_sum"], WORLD_SIZE)


instantiate_parametrized_tests(TestPackageDistributed)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
    else:
        from torch._dynamo.test_case import run_tests

        run_tests()
