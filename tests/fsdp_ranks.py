"""One rank of tests/test_torch_fsdp.py's two-rank run (gloo, CPU): an FSDP2 model whose groups
shimrt.torch.fsdp.use moves between process groups step by step, beside a plain FSDP2 copy;
prints what the test checks.

Usage: python fsdp_ranks.py RANK PORT [OPTION]   OPTION: hsdp, offload (what moveable refuses), custom
(the groups moved through FSDP2's public custom collectives, shimrt.torch.fsdp.install), prefetch (FSDP2's
explicit prefetch changed as the groups move, shimrt.torch.fsdp.prefetch), reshard (the blocks kept
all-gathered from forward to backward for some steps, shimrt.torch.fsdp.keep_gathered), settings (two
models on one mesh, one moved, prefetching and kept gathered, then put back: shimrt.torch.fsdp.settings)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from shimrt import UsageError
from shimrt.torch.fsdp import (
    GroupAllGather,
    GroupReduceScatter,
    below_root,
    gathered_bytes,
    held_prefetch,
    install,
    is_fsdp,
    keep_gathered,
    moveable,
    param_groups,
    prefetch,
    reshard_again,
    restore_prefetch,
    settings,
    uninstall,
    use,
)


def model(head: bool = False) -> torch.nn.Module:
    """Four layers, and with ``head`` a fifth that the root shards as its own."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(5 if head else 4)])


def sharded(m: torch.nn.Module, mesh: DeviceMesh, **options) -> torch.nn.Module:
    for layer in list(m)[:4]:  # a fifth layer stays the root's own
        fully_shard(layer, mesh=mesh, **options)
    return fully_shard(m, mesh=mesh, **options)


def count_calls() -> dict[str, list]:
    """The group of every all-gather and reduce-scatter from here on, in order, by kind: torch's
    collectives wrapped where FSDP2 and shimrt look them up (the newest name this torch has)."""
    calls: dict[str, list] = {"all_gather": [], "reduce_scatter": []}
    for kind, names in (("all_gather", ("all_gather_single", "all_gather_into_tensor")),
                        ("reduce_scatter", ("reduce_scatter_single", "reduce_scatter_tensor"))):
        name = next(n for n in names if hasattr(dist, n))
        real = getattr(dist, name)

        def counted(*args, _real=real, _kind=kind, **kwargs):
            calls[_kind].append(kwargs.get("group"))
            return _real(*args, **kwargs)
        setattr(dist, name, counted)
    return calls


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    option = sys.argv[3] if len(sys.argv) > 3 else None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if option not in (None, "custom", "prefetch", "reshard", "settings"):
        options = {"hsdp": {}, "offload": {"offload_policy": CPUOffloadPolicy(pin_memory=False)}}
        shape = (1, 2) if option == "hsdp" else (2,)  # HSDP: replicas of 1 (a 2-D mesh all the same)
        names = ("replicate", "shard") if option == "hsdp" else ("shard",)
        m = sharded(model(), init_device_mesh("cpu", shape, mesh_dim_names=names), **options[option])
        print(f"rank {rank}: moveable {moveable(param_groups(m))}", flush=True)
        dist.destroy_process_group()
        os._exit(0)
    if option == "settings":
        mesh = init_device_mesh("cpu", (2,))
        a, b = sharded(model(), mesh), sharded(model(), mesh)
        for m in (a, b):  # a step each: FSDP2's lazy set-up made
            m(torch.randn(4, 32)).pow(2).mean().backward()

        def unlike() -> str:
            mine, theirs = settings(a), settings(b)
            return ",".join(sorted(k for k in mine if mine[k] != theirs[k])) or "same"
        said = [unlike()]
        own, held = param_groups(a)[0].mesh_info.shard_process_group, held_prefetch(a)
        use(param_groups(a), dist.new_group([0, 1]))
        prefetch(a, 2)
        kept = keep_gathered(below_root(a))
        said.append(unlike())
        use(param_groups(a), own)
        restore_prefetch(held)
        reshard_again(kept)
        said.append(unlike())
        print(f"rank {rank}: settings {' '.join(said)}", flush=True)
        dist.destroy_process_group()
        os._exit(0)
    calls = count_calls()
    first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
    head = option == "reshard"  # the root with parameters of its own: keep_gathered must leave them to FSDP2
    user = sharded(model(head), DeviceMesh.from_group(first, "cpu"))
    plain = sharded(model(head), init_device_mesh("cpu", (2,)))
    groups = param_groups(user)
    lists: list[str] = []  # what the test checks beside the counts: prefetch lists held, collectives restored
    comms = None
    if option == "custom":  # FSDP2 passes its own group; shimrt's collectives run on theirs
        comms = (GroupAllGather(first), GroupReduceScatter(first))
        replaced = install(user, comms)
        other = sharded(model(), DeviceMesh.from_group(first, "cpu"))  # a user's own all-gather on its last block

        class Mine(GroupAllGather):
            pass
        other[3].set_custom_all_gather(Mine(first))
        try:
            install(other, comms)
            lists.append("not refused")
        except UsageError as exc:  # nothing changed: the first blocks keep FSDP2's own
            kept = type(param_groups(other[0], below=False)[0]._all_gather_comm).__name__
            lists.append(f"refused ({'Mine' in str(exc)}, {kept})")

    def move(group: dist.ProcessGroup) -> None:
        if comms is None:
            use(groups, group)
        else:
            for comm in comms:
                comm.group = group
    opt = torch.optim.SGD(user.parameters(), lr=0.1, momentum=0.9)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    depths = {0: 2, 3: None, 5: 1} if option == "prefetch" else {}  # from these steps on (None: the user's own)

    def held_lists() -> None:  # the blocks' (held_prefetch's first state is the root's)
        lists.append(",".join(f"{len(forward)}{len(backward)}" for _, forward, backward in held_prefetch(user)[1:]))
    if depths:
        user[0].set_modules_to_forward_prefetch([user[2]])  # the user's own list, before any policy
        own = held_prefetch(user)
    gathered = {0: True, 3: False, 5: True} if option == "reshard" else {}  # from these steps on
    resharding = None
    if gathered:  # what FSDP2 holds, as the groups' post-forward meshes say (None: kept all-gathered)
        lists.append(f"bytes {gathered_bytes(below_root(user))}")
    for step in range(8):
        if step in gathered:
            if gathered[step]:
                resharding = keep_gathered(below_root(user))
            else:
                reshard_again(resharding)
            lists.append(settings(user)["gathered"])
        if step in depths:
            if depths[step] is None:
                restore_prefetch(own)
            else:
                prefetch(user, depths[step])
            held_lists()
        if step < 5:
            move(second if step % 2 else first)
        elif step == 5:
            move(second)
            dist.destroy_process_group(first)  # from here FSDP2 must all-gather and reduce-scatter on second
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        for m, o in ((user, opt), (plain, plain_opt)):
            m(x).pow(2).mean().backward()
            o.step()
            o.zero_grad()
    # Each rank's shards (DTensor ops would use the destroyed group: the DeviceMesh keeps it).
    diff = max((a.to_local() - b.to_local()).abs().max().item()
               for a, b in zip(user.parameters(), plain.parameters(), strict=True))
    if comms is not None:  # FSDP2's own collectives back, as the plain job and close() put them
        uninstall(replaced)
        kinds = {type(c).__name__ for g in groups for c in (g._all_gather_comm, g._reduce_scatter_comm)}
        lists.append("restored " + ",".join(sorted(kinds)))
    if resharding is not None:  # the end: FSDP2's own resharding back
        reshard_again(resharding)
        lists.append(settings(user)["gathered"])
    if depths:  # the end: the user's lists back
        restore_prefetch(own)
        held_lists()
    counts = [f"{kind} {sum(g is first for g in made)}+{sum(g is second for g in made)}"
              for kind, made in calls.items()]
    held = f"{'prefetch ' if depths else 'reshard ' if gathered else ''}{' '.join(lists)}; " if lists else ""
    print(f"rank {rank}: {held}calls {' '.join(counts)}; fsdp {is_fsdp(user)} groups {len(groups)} "
          f"moveable {moveable(groups)} diff {diff}", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown racing gloo's threads


if __name__ == "__main__":
    main()
