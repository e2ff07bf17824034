"""``ncclConfig_t`` laid out as the loaded library's ``nccl.h`` defines it, and the options shimrt sets.

NCCL grows the structure at its end from release to release and copies
``min(config->size, sizeof(its own))`` bytes, so each library gets exactly its own layout:
the fields below, in order, each from the release whose ``nccl.h`` first has it (read from
the nvidia-nccl wheels' headers, 2.17.1 to 2.32.3). Unset fields keep NCCL's "undefined"
values (INT_MIN, NULL), as ``NCCL_CONFIG_INITIALIZER`` leaves them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .. import validate
from ..config import settings
from ..errors import CollectiveError, UsageError
from ..stream import timeout_seconds

__all__ = ["MIN_VERSION", "check_shared_gpu", "has_field", "CommOptions"]

MAGIC = 0xCAFEBEEF        # NCCL_API_MAGIC
UNDEF_INT = -(2**31)      # NCCL_CONFIG_UNDEF_INT = INT_MIN
CTA_POLICIES = {"default": 0x00, "efficiency": 0x01, "zero": 0x02}  # NCCL_CTA_POLICY_* (2.27+)

_int, _ptr = ctypes.c_int, ctypes.c_char_p
# (field, ctype, first NCCL version (X*10000 + Y*100 + Z) whose ncclConfig_t has it)
FIELDS = (
    ("size", ctypes.c_size_t, 21700), ("magic", ctypes.c_uint, 21700), ("version", ctypes.c_uint, 21700),
    ("blocking", _int, 21700), ("cgaClusterSize", _int, 21700), ("minCTAs", _int, 21700),
    ("maxCTAs", _int, 21700), ("netName", _ptr, 21700), ("splitShare", _int, 21800),
    ("trafficClass", _int, 22600),
    ("commName", _ptr, 22700), ("collnetEnable", _int, 22700), ("CTAPolicy", _int, 22700),
    ("shrinkShare", _int, 22700), ("nvlsCTAs", _int, 22700),
    ("nChannelsPerNetPeer", _int, 22800), ("nvlinkCentricSched", _int, 22800),
    ("graphUsageMode", _int, 22900), ("numRmaCtx", _int, 22900),
    ("maxP2pPeers", _int, 23000), ("graphStreamOrdering", _int, 23000),
    ("launchOrderImplicit", _int, 23100), ("numRmaSig", _int, 23100), ("rmaEagerInit", _int, 23100),
    ("hostCftMode", _int, 23100),
    ("nvlsHostMode", _int, 23200),
)
MIN_VERSION = FIELDS[0][2]
MULTI_RANK_GPU_VERSION = 23000  # the first NCCL that can put ranks of one communicator on one GPU


def check_shared_gpu(lib: Any, backend: str, where: str, *, process_per_rank: bool = False) -> None:
    """CollectiveError, before NCCL is called, when ``where`` puts several ranks on one GPU and
    the NCCL in ``lib`` would refuse it ("Duplicate GPU detected"): NCCL before 2.30, or 2.30+
    without NCCL_MULTI_RANK_GPU_ENABLE=1. Not where each rank has a process of its own
    (``process_per_rank``) that names its own host to NCCL (NCCL_HOSTID, :mod:`shimrt.nccl.link`):
    NCCL then sees one GPU per host. RCCL ("hip") answers for itself."""
    if backend != "cuda" or (process_per_rank and settings().nccl_hostid is not None):
        return
    if lib.version < MULTI_RANK_GPU_VERSION:
        raise CollectiveError(f"{where} puts several ranks on one GPU, which NCCL {lib.version_text} ({lib.path}) "
                              "refuses; NCCL 2.30 or newer allows it with NCCL_MULTI_RANK_GPU_ENABLE=1 (point "
                              "SHIMRT_NCCL_LIBRARY at such a libnccl.so.2)")
    if not settings().nccl_multi_rank_gpu:
        raise CollectiveError(f"{where} puts several ranks on one GPU: NCCL {lib.version_text} allows that only "
                              "with NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment (experimental in NCCL)")


def structure(version: int) -> type[ctypes.Structure]:
    """The ncclConfig_t ctypes Structure of NCCL ``version`` (X*10000 + Y*100 + Z)."""
    return _structure(_version(version))


def _version(version) -> int:
    # ncclConfig_t.version is a 32-bit unsigned int: a larger value would be cut short, not refused.
    return validate.integer(version, "NCCL version (X*10000 + Y*100 + Z, e.g. 22809)", least=0, most=2**31 - 1)


@lru_cache(maxsize=None)
def _structure(version: int) -> type[ctypes.Structure]:
    if version < MIN_VERSION:
        raise UsageError(f"NCCL {version} predates ncclConfig_t as shimrt knows it (2.17)")
    fields = [(name, ctype) for name, ctype, since in FIELDS if since <= version]
    return type(f"ncclConfig_v{version}", (ctypes.Structure,), {"_fields_": fields})


def has_field(version: int, name: str) -> bool:
    """Whether NCCL ``version``'s ncclConfig_t has the field ``name``."""
    version = _version(version)
    return any(n == name and since <= version for n, _, since in FIELDS)


@dataclass(frozen=True)
class CommOptions:
    """Communicator options. ``None`` leaves NCCL's default.

    ``blocking=True`` (the default) makes each NCCL call return once its work is enqueued, at
    NCCL's own speed; shimrt still bounds every wait by ``timeout`` seconds (a positive number):
    initialisation on a helper thread, collectives through the process's watchdog, which aborts
    a communicator whose collective outlives the timeout (see :mod:`shimrt.nccl.watchdog`).
    ``blocking=False`` makes a non-blocking communicator, every call of which shimrt polls until
    it settles. It costs: NCCL starts a host thread for every non-blocking group launch (its
    ``src/group.cc``), so a small collective takes several times longer (docs/results.md has the
    figures); from some MiB up the transfer hides the difference.
    ``min_ctas``/``max_ctas`` bound NCCL's channels (one block each, 1-64), ``cta_policy`` is
    "default", "efficiency" or "zero" (NCCL 2.27+), ``cga_cluster_size`` 0-8, ``net_name`` the
    network plugin NCCL must use (e.g. "IB", "Socket"). Every field is checked here, when made.
    """

    blocking: bool = True
    timeout: float = 300.0
    min_ctas: int | None = None
    max_ctas: int | None = None
    cta_policy: str | None = None
    cga_cluster_size: int | None = None
    net_name: str | None = None

    def __post_init__(self) -> None:
        # Checked values are stored as plain Python values (numpy integers become ints).
        def put(name, value):
            object.__setattr__(self, name, value)

        put("blocking", validate.boolean(self.blocking, "blocking"))
        put("timeout", timeout_seconds(self.timeout, "timeout"))
        for name in ("min_ctas", "max_ctas"):
            if getattr(self, name) is not None:
                put(name, validate.integer(getattr(self, name), name, least=1, most=64))
        if self.min_ctas is not None and self.max_ctas is not None and self.min_ctas > self.max_ctas:
            raise UsageError(f"min_ctas must be at most max_ctas ({self.max_ctas}), not {self.min_ctas}")
        if self.cta_policy is not None:
            validate.one_of(self.cta_policy, "cta_policy", CTA_POLICIES)
        if self.cga_cluster_size is not None:
            put("cga_cluster_size", validate.integer(self.cga_cluster_size, "cga_cluster_size", least=0, most=8))
        if self.net_name is not None:
            # NCCL reads a C string: a NUL would cut it short, and non-ASCII names match no plugin.
            validate.text(self.net_name, "net_name")
            if not self.net_name.isascii():
                raise UsageError(f"net_name must be an ASCII network name such as 'IB' or 'Socket', "
                                 f"not {self.net_name!r}")

    def build(self, version: int) -> ctypes.Structure:
        """An ncclConfig_t for NCCL ``version`` holding these options."""
        version = _version(version)
        cls = structure(version)
        cfg = cls()
        for name, ctype, since in FIELDS:
            if since <= version and ctype is _int:
                setattr(cfg, name, UNDEF_INT)
        cfg.size, cfg.magic, cfg.version = ctypes.sizeof(cls), MAGIC, version
        cfg.blocking = 1 if self.blocking else 0
        for ours, theirs in (("min_ctas", "minCTAs"), ("max_ctas", "maxCTAs"), ("cga_cluster_size", "cgaClusterSize")):
            if getattr(self, ours) is not None:
                setattr(cfg, theirs, getattr(self, ours))
        if self.net_name is not None:
            cfg.netName = self.net_name.encode()
        if self.cta_policy is not None:
            if not has_field(version, "CTAPolicy"):
                raise UsageError(f"cta_policy needs NCCL 2.27 or newer; this NCCL is {version}")
            cfg.CTAPolicy = CTA_POLICIES[self.cta_policy]
        return cfg
