"""Host launchers of the Triton kernels (no validation here: the entry points validate first).

Shape legend: S packed tokens, C channels, N segments, L leaves (``leaf_tree``), G groups,
n listed rows (KCP boundary rows), K halo rows.

Each launcher computes its grid and arguments into a ``Prepared`` launch (``Kernel.prepare``;
``prepare_forward`` / ``prepare_backward`` from metadata alone, so that conv.py's plans keep them
across calls), whose ``run`` launches the compiled kernel directly instead of through
``kernel[grid](...)``. The latter binds every argument,
derives Triton's specialization of each (dtype and 16-byte alignment of pointers, integers equal
to 1 or divisible by 16) and looks up its cache on every call, and its C launcher then asks the
driver about every pointer: about 17 us of host time on the H200 machine for a 19-argument
kernel, more than the rest of a small call. Here the compiled kernel is keyed by what determines
Triton's specialization:

- integer arguments: every kernel marks them ``do_not_specialize``, so one compiled kernel serves
  all their values (no constexpr variant for 1, none for multiples of 16: the compile failure of
  a one-segment KCP rank cannot recur) and the key holds none of them. They stay below 2**31
  (the entry points check S; the others are bounded by S and 5 C), so Triton types them i32;
- pointers: the key holds every pointer's dtype and requires all of them 16-byte aligned (one OR
  of the addresses); a launch with an unaligned pointer takes Triton's own path (correct, slower).
  The fast path passes the addresses as integers;
- constexprs and the launch options (warps, register cap): in the key as values.

Quick twins. The forward and backward launches of a plan may carry an ``EarlyLaunch``: the same
computation by the kernels' quick twins (``*_quick_kernel``: one code path for every program, the
same bits, a compile several times shorter, a slower run), whose row strides are integer arguments
and whose launch configuration is one for every C, so that one compiled twin serves every channel
count and layout of its dtypes, width and activation. While the full variants compile in the
background (compile_ahead.py) the twin runs; once they are ready, the launch drops it and runs its
own.

The package's tests record the launches of every launcher (``record_launches``) and check on
the CPU, with Triton's own specialization code for sm_90, that equal keys mean equal
specializations and that every recorded launch compiles.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch
from triton import knobs

from ..constants import ACTIVATIONS, INTERPRET, TAPS
from . import tuning
from .backward import (
    BWD_SUB,
    GROUP_BLOCK,
    LOG2_GROUP_BLOCK,
    LOG2_TREE_LEAVES,
    TREE_LEAVES,
    cake_conv_bwd_dx_rows_kernel,
    cake_conv_bwd_group_kernel,
    cake_conv_bwd_head_kernel,
    cake_conv_bwd_kernel,
    cake_conv_bwd_one_group_kernel,
    cake_conv_bwd_one_group_quick_kernel,
    cake_conv_bwd_quick_kernel,
)
from .forward import cake_conv_fwd_kernel, cake_conv_fwd_quick_kernel, cake_conv_fwd_rows_kernel
from .common import SEGMENT_IDS
from .halo import cake_halo_gather_kernel
from .segment_ids import SegmentIdsCache, cake_segment_ids_kernel, use_segment_ids

try:  # the CUDA build of torch; Triton's own driver reads the stream the same way
    from torch._C import _cuda_getCurrentRawStream, _cuda_getDevice
except ImportError:  # CPU build (the interpreter and the recorder need neither)
    _cuda_getCurrentRawStream = _cuda_getDevice = None

SEGMENT_IDS_VALUE = SEGMENT_IDS.value  # HAS_CU of a launch with per-token segment ids
# Held by a launch through Triton's own path (which compiles on a cache miss) and by compile_ahead.py's
# threads while Triton turns a kernel's syntax tree into IR: CPython 3.11's ast.parse is not safe in
# two threads at once, and a launch of another thread may compile while those threads do.
FRONT_END = threading.Lock()
_GROUP_BLK = 64
# Explicit FMAs only: with contraction on, the compiler may fuse a multiply into a later add in one
# code path (masked / unmasked, varlen / uniform) and not in another, which changes bits.
_NO_FUSION = {"enable_fp_fusion": False}


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return INTERPRET


# ------------------------------------------------------------------------------- launching

@dataclass
class Launch:
    """One recorded launch: the kernel, its key, grid, every argument in order, launch options; ``twin``:
    launched by a quick twin's launch (``record_launches(twins=True)``)."""

    kernel: "Kernel"
    key: tuple | None
    grid: tuple
    args: tuple
    options: dict
    twin: bool = False


_recording: list | None = None
_recording_launches: bool = False
_recording_twins: bool = False
_in_twin: bool = False  # a twin's launch runs (recording with twins)


@contextlib.contextmanager
def record_launches(launch: bool = False, twins: bool = False):
    """Record every ``Kernel.launch`` in a list (yielded); with ``launch`` False nothing runs.
    ``twins``: the plans made meanwhile (conv.py) carry their quick twins, and a launch that has one
    records both, the twin's (``Launch.twin`` set) and its own."""
    global _recording, _recording_launches, _recording_twins
    previous = (_recording, _recording_launches, _recording_twins)
    _recording, _recording_launches, _recording_twins = [], launch, twins
    try:
        yield _recording
    finally:
        _recording, _recording_launches, _recording_twins = previous


def recording_twins() -> bool:
    """True inside ``record_launches(twins=True)``."""
    return _recording is not None and _recording_twins


def _record_twin(twin, *args) -> None:
    """Record the launches of ``twin.run(*args)``, marked as a twin's (``Launch.twin``)."""
    global _in_twin
    _in_twin = True
    try:
        twin.run(*args)
    finally:
        _in_twin = False


def _hooks_set() -> bool:
    """A launch hook is installed (a profiler): then launches go through Triton's own path."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and (not isinstance(hook, knobs.HookChain) or bool(hook.calls))


class Kernel:
    """A ``@triton.jit`` kernel and its compiled variants, launched without per-call binding.

    ``prepare(grid, dtypes, scalars, constants, warps, maxnreg=None)`` fixes everything of a launch
    but the pointers and returns a ``Prepared`` launch; ``launch(grid, pointers, ...)`` is prepare
    and run in one. The kernel's parameters are its pointer parameters (``pointers``, tensors), then
    its integer parameters (``scalars``), then its constexprs (``constants``), in that order, as
    every kernel of this package declares them; ``warps`` and ``maxnreg`` are the launch options (FP
    contraction is always off). ``dtypes``: a tuple that determines every pointer's dtype given the
    constants (the launcher's knowledge, e.g. y has x's dtype; the specialization tests check it).

    The compiled kernel is cached under (device, dtypes, constants, options) when every pointer is
    16-byte aligned (module docstring) and launched directly with the pointers passed as addresses
    (no ``data_ptr`` call or driver pointer query per argument in the launcher); otherwise, and for
    the first launch of a key, ``kernel[grid](...)`` runs it.

    ``pdl``: every launch is a programmatic dependent launch (the kernel may start while the one
    before it on the stream finishes; it must wait for it, ``gdc_wait``, before touching memory).
    """

    def __init__(self, fn, pdl=False):
        self.fn = fn
        self.name = fn.__name__
        self.pdl = pdl
        self._compiled: dict = {}

    def prepare(self, grid, dtypes, scalars, constants, warps, maxnreg=None) -> "Prepared":
        return Prepared(self, grid, dtypes, scalars, constants, warps, maxnreg)

    def launch(self, grid, pointers, dtypes, scalars, constants, warps, maxnreg=None):
        Prepared(self, grid, dtypes, scalars, constants, warps, maxnreg).run(pointers)


class Prepared:
    """One launch of a ``Kernel`` with all but its pointers fixed; ``run(pointers)`` launches it.

    Launchers build these from shapes, dtypes and strides alone, so a caller that has seen the same
    operand metadata before (conv.py's plans) reuses them: a run then reads the pointers' addresses,
    checks their alignment and launches the compiled kernel it found the last time. A plan's
    launches always run on its operands' device (conv.py makes it current), so the remembered
    kernel is looked up again only if that ever differs.
    """

    __slots__ = ("kernel", "grid", "key", "args", "warps", "maxnreg", "_device", "_direct")

    def __init__(self, kernel, grid, dtypes, scalars, constants, warps, maxnreg=None):
        self.kernel = kernel
        self.grid = grid
        self.key = (dtypes, constants, warps, maxnreg)
        self.args = (*scalars, *constants)
        self.warps = warps
        self.maxnreg = maxnreg
        self._device = None  # the device of the launch function remembered in _direct
        self._direct = None

    def _find(self, device):
        """(launch function, arguments between the stream and the pointers) of the compiled kernel
        of this key on ``device``, remembered; None before the key's first launch."""
        compiled = self.kernel._compiled.get((device, self.key))
        self._device, self._direct = device, None if compiled is None else direct_launch(compiled)
        return self._direct

    def run(self, pointers):
        addrs = [p.data_ptr() for p in pointers]
        bits = 0
        for a in addrs:
            bits |= a
        if _recording is not None:
            key = None if bits & 15 else self.key
            _recording.append(Launch(self.kernel, key, self.grid, (*pointers, *self.args),
                                     _options(self.warps, self.maxnreg, self.kernel.pdl), _in_twin))
            if not _recording_launches:
                return
        if INTERPRET:
            self.kernel.fn[self.grid](*pointers, *self.args, **_options(self.warps, self.maxnreg, self.kernel.pdl))
            return
        device = _cuda_getDevice()
        if not bits & 15:
            direct = self._direct if self._device == device else self._find(device)
            if direct is not None and not _hooks_set():
                fn, head = direct
                grid = self.grid
                fn(grid[0], grid[1], grid[2], _cuda_getCurrentRawStream(device), *head, *addrs, *self.args)
                return
        cache_keys_in_fixed_order()
        with FRONT_END:
            compiled = self.kernel.fn[self.grid](*pointers, *self.args,
                                                 **_options(self.warps, self.maxnreg, self.kernel.pdl))
        if not bits & 15:
            self.kernel._compiled[(device, self.key)] = compiled
            self._device, self._direct = device, direct_launch(compiled)


def direct_launch(compiled):
    """How ``Prepared.run`` launches a compiled kernel: (function, arguments between the stream and
    the kernel's own arguments), called as ``function(gx, gy, gz, stream, *head, *arguments)``.

    Triton's launcher object (``compiled.run``, Python) allocates the kernel's global and profile
    scratch buffers, when it has any, and calls its C launch function. A kernel without either (all
    of this package's) is launched by that C function directly, one Python frame less per launch;
    any other launcher is called as Triton calls it.
    """
    launcher = compiled.run
    c_launch = getattr(launcher, "launch", None)
    if (c_launch is not None and getattr(launcher, "global_scratch_size", 1) == 0
            and getattr(launcher, "profile_scratch_size", 1) == 0 and hasattr(launcher, "launch_pdl")):
        # the C function's arguments: grid, stream, function, cooperative, pdl, global scratch,
        # profile scratch, packed metadata, launch metadata, enter hook, exit hook, kernel arguments
        return c_launch, (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                          compiled.packed_metadata, None, None, None)
    return launcher, (compiled.function, compiled.packed_metadata, None, None, None)


FWD = Kernel(cake_conv_fwd_kernel)
FWD_ROWS = Kernel(cake_conv_fwd_rows_kernel)
BWD = Kernel(cake_conv_bwd_kernel)
BWD_ONE_GROUP = Kernel(cake_conv_bwd_one_group_kernel)
BWD_GROUP = Kernel(cake_conv_bwd_group_kernel, pdl=True)  # right after the main kernel, which lets it launch early
BWD_HEAD = Kernel(cake_conv_bwd_head_kernel)
BWD_DX_ROWS = Kernel(cake_conv_bwd_dx_rows_kernel)
HALO_GATHER = Kernel(cake_halo_gather_kernel)
SEGMENT_IDS_BUILD = Kernel(cake_segment_ids_kernel)
FWD_QUICK = Kernel(cake_conv_fwd_quick_kernel)
BWD_QUICK = Kernel(cake_conv_bwd_quick_kernel)
BWD_ONE_GROUP_QUICK = Kernel(cake_conv_bwd_one_group_quick_kernel)
QUICK_KERNELS = (FWD_QUICK, BWD_QUICK, BWD_ONE_GROUP_QUICK)  # the quick twins of ...
WITH_TWINS = (FWD, BWD, BWD_ONE_GROUP)  # ... these (the other kernels serve both)
KERNELS = (FWD, FWD_ROWS, BWD, BWD_ONE_GROUP, BWD_GROUP, BWD_HEAD, BWD_DX_ROWS, HALO_GATHER, SEGMENT_IDS_BUILD,
           *QUICK_KERNELS)
KERNEL_FNS = {k.name: k.fn for k in KERNELS}  # the Triton functions by kernel name (compiles ahead of the launches)
BACKWARD_KERNEL_NAMES = frozenset(k.name for k in (BWD, BWD_ONE_GROUP, BWD_GROUP, BWD_HEAD, BWD_DX_ROWS, BWD_QUICK,
                                                   BWD_ONE_GROUP_QUICK))  # launched by a backward only
_CACHE_KEYS_READY = False


def cache_keys_in_fixed_order() -> None:
    """Compute every kernel's Triton cache key once per process, in ``KERNELS``' order, before the
    first compile or cache look-up.

    Triton 3.6 hashes into a kernel's key the global constexprs its helper functions use, as far as
    it has seen them: a helper's are merged only once the helper's own key was computed, for
    whichever kernel came first. So one kernel's key, and with it its entry in the on-disk cache,
    depends on which kernels the process hashed before (measured: the backward kernel's key differs
    after the one-group kernel was compiled). Hashing all of them in one fixed order first gives
    every process the same keys, whatever its first launch: what ``cakeconv.warmup`` compiled ahead
    is what a run finds. Costs about 20 ms, once. Waits for Triton's installation key if the thread
    started at import is still computing it (``compile_ahead.key_ahead``: the first compile would
    otherwise compute it a second time beside it).
    """
    global _CACHE_KEYS_READY
    if not _CACHE_KEYS_READY:
        from ..compile_ahead import _key_thread

        if _key_thread is not None:
            _key_thread.join()
        for kernel in KERNELS:
            kernel.fn.cache_key  # noqa: B018 (computed and kept by Triton)
        _CACHE_KEYS_READY = True


_OPTIONS: dict = {}


def _options(warps: int, maxnreg: int | None, pdl: bool = False) -> dict:
    """Triton launch options (one dict per combination, reused)."""
    opts = _OPTIONS.get((warps, maxnreg, pdl))
    if opts is None:
        opts = {"num_warps": warps, **({} if maxnreg is None else {"maxnreg": maxnreg}), **_NO_FUSION,
                **({"launch_pdl": True} if pdl else {})}
        _OPTIONS[(warps, maxnreg, pdl)] = opts
    return opts


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------- the convolution

WIDE_LEAVES = 5  # from this width on, the dweight tree's leaves hold 2 * BWD_SUB rows (leaf_tree)


def leaf_tree(width: int) -> tuple[int, int, int]:
    """(rows per leaf, leaves per group, log2 of the leaves per group) of the backward's dweight tree
    at ``width`` taps: part of the summation order, so fixed by W, never by a tuning choice.

    A leaf's walk also reads the W - 1 rows before it and recomputes g of the W - 1 rows after it;
    from W = WIDE_LEAVES on, leaves of 128 rows halve that (64 leaves to a group, so a group is 8,192
    rows at every width and the one-group regime is S <= 8,192 at every width). W <= 4 keeps 64-row
    leaves, 128 to a group: W = 4's bits do not change. One H100, backward alone, C = 512, no bias,
    1-64-token documents: W = 5 + SiLU 3.4% faster, W = 7 4.5%, W = 8 5.3%; the seed mix 2.1-3.0%
    (benchmarks/NOTES.md 3.7).
    """
    if width >= WIDE_LEAVES:
        return 2 * BWD_SUB, TREE_LEAVES // 2, LOG2_TREE_LEAVES - 1
    return BWD_SUB, TREE_LEAVES, LOG2_TREE_LEAVES


def backward_workspace_floats(S: int, C: int, width: int = TAPS) -> int:
    """FP32 elements of the backward workspace: level-0 leaf partials ((width + 1) * C floats a
    leaf: the taps' and the bias's) plus group sums.

    Sized for the smallest R a configuration may use (R = 1), so it never depends on tuning.
    """
    sub, leaves_per_group, _ = leaf_tree(width)
    n_leaves = cdiv(S, sub)
    n_groups = cdiv(n_leaves, leaves_per_group)
    return (width + 1) * C * (n_leaves + n_groups)


def activation_flag(activation) -> int:
    """The kernels' ACT constexpr: 1 for "silu", 0 for None (the entry points validated it)."""
    assert activation in ACTIVATIONS, activation
    return 1 if activation == "silu" else 0


use_ids = True  # per-token segment indices for many segments (tests switch them off to compare bits)
SEGMENT_IDS_CACHE = SegmentIdsCache()


def triton_segment_ids(cu_N1, out):
    """Launch the build of out = [cu | ids] (kernels/segment_ids.py); out int32 [N + 1 + S]."""
    n1 = cu_N1.shape[0]
    S = out.shape[0] - n1
    blk, warps = (16, 1) if INTERPRET else (1024, 4)
    SEGMENT_IDS_BUILD.launch((cdiv(max(n1, S), blk), 1, 1), (cu_N1, out), (cu_N1.dtype,), (n1, S), (blk,), warps)
    return out


def segment_ids_buffer(cu_seqlens, S):
    """The [cu | per-token segment ids] buffer of this cu_seqlens tensor for S tokens (built on
    first use, or when the tensor changed, on the current stream; captured under a CUDA graph)."""
    on_gpu = cu_seqlens.is_cuda and not INTERPRET
    stream = _cuda_getCurrentRawStream(cu_seqlens.get_device()) if on_gpu else 0
    capturing = on_gpu and torch.cuda.is_current_stream_capturing()
    # launches recorded but not run leave the buffer unwritten: not cached then
    cache = _recording is None or _recording_launches
    return SEGMENT_IDS_CACHE.get(cu_seqlens, S, stream, capturing, triton_segment_ids, cache)


def optional_meta(b_C, cu_seqlens):
    """(b dtype, cu dtype, cu entries) of the optional operands, None where absent: what the
    prepare functions take of them."""
    if cu_seqlens is None:
        return None if b_C is None else b_C.dtype, None, None
    return None if b_C is None else b_C.dtype, cu_seqlens.dtype, cu_seqlens.shape[0]


def _segments(S, n_cu, seq_len):
    """(n_seg, T) kernel arguments: n_cu = cu_seqlens.shape[0] (None: uniform documents of seq_len)."""
    if n_cu is not None:
        return n_cu - 1, max(S, 1)
    T = seq_len if seq_len else max(S, 1)
    return cdiv(S, T), T


def _ids_apply(S, C, n_cu) -> bool:
    """The main kernels have an index variant for this problem (use_segment_ids; the module
    switch ``use_ids`` picks it at each launch)."""
    return n_cu is not None and use_segment_ids(n_cu - 1, S, C)


class EarlyLaunch:
    """A launch's quick twin (``prepare_forward`` / ``prepare_backward`` with ``quick=True``), run in
    its place until ``ready`` (a ``threading.Event``) is set: the full variants are then in Triton's
    cache. Capturing a CUDA graph waits for them instead (a graph keeps the kernels it captured);
    ``on_gpu``: the launches run on a CUDA device (only there can a graph be captured); ``compiled``:
    None, or an event set once the twin is in Triton's cache (still compiling in another thread: the
    twin waits for it rather than compile it again)."""

    __slots__ = ("launch", "ready", "on_gpu", "compiled")

    def __init__(self, launch, ready, on_gpu: bool, compiled=None):
        self.launch, self.ready, self.on_gpu, self.compiled = launch, ready, on_gpu, compiled

    def active(self) -> bool:
        """True while the twin runs in the launch's place."""
        if self.ready.is_set():
            return False
        if self.on_gpu and torch.cuda.is_current_stream_capturing():
            self.ready.wait()
            return False
        if self.compiled is not None:
            self.compiled.wait()
            self.compiled = None
            return not self.ready.is_set()
        return True


class ForwardLaunch:
    """The forward kernel's launch for one operand layout (``prepare_forward``).

    ``run(x_SC, w_CW, b_C, cu, y_SC, hist_NHC=None)`` with tensors of the layout it was prepared
    for (x and y may be any views of those rows, e.g. [1, S, C]: only their addresses are read).
    ``ids``: the variant reading per-token segment indices (None where it does not apply); it runs
    while ``use_ids`` is set, with cu's index buffer as its cu pointer. ``early``: an ``EarlyLaunch``
    to run instead while it is active (None: none).
    """

    __slots__ = ("main", "ids", "S", "early")

    def __init__(self, main: Prepared, ids, S: int):
        self.main, self.ids, self.S, self.early = main, ids, S, None

    def run(self, x_SC, w_CW, b_C, cu, y_SC, hist_NHC=None):
        early = self.early
        if early is not None:
            if early.active():
                if not _recording_twins:
                    early.launch.run(x_SC, w_CW, b_C, cu, y_SC, hist_NHC)
                    return
                _record_twin(early.launch, x_SC, w_CW, b_C, cu, y_SC, hist_NHC)  # then its own below
            else:
                self.early = None
        # b, cu and hist stand in with w when absent (the kernel does not read them then)
        b = w_CW if b_C is None else b_C
        hist = w_CW if hist_NHC is None else hist_NHC
        if self.ids is not None and use_ids:
            self.ids.run((x_SC, y_SC, w_CW, b, segment_ids_buffer(cu, self.S), hist))
        else:
            self.main.run((x_SC, y_SC, w_CW, b, w_CW if cu is None else cu, hist))


def prepare_forward(S, C, x_stride, y_stride, x_dtype, w_dtype, b_dtype, cu_dtype, n_cu, seq_len,
                    has_hist=False, config=None, *, width=TAPS, activation="silu", quick=False) -> ForwardLaunch:
    """The forward launch for S > 0 rows of C channels: row strides (multiples of 8) and dtypes of
    x / y (y has x's dtype), w, b (None: no bias) and cu (None: uniform documents of seq_len);
    n_cu = cu_seqlens.shape[0]; has_hist: KCP history rows are given (x's dtype); the taps'
    width W and the activation ("silu" or None); quick: the quick twin (same bits; its own
    configuration, ``config`` is not used)."""
    act = activation_flag(activation)
    assert S > 0
    n_seg, T = _segments(S, n_cu, seq_len)
    if quick:
        cfg = tuning.pick_quick_configs(INTERPRET, width)[0]
    else:
        cfg = config or tuning.pick_fwd_config(C, x_dtype.itemsize, INTERPRET, width=width)
    assert cfg.SUB % (8 if width >= 6 else 4) == 0, "a sub-run is whole row-loop steps (8 rows from W = 6)"
    grid = (cdiv(S, cfg.R * cfg.SUB) * cdiv(C, cfg.BC), 1, 1)
    scalars = (S, C // 8, n_seg, T)
    strides = (x_stride // 8, y_stride // 8)

    def variant(has_cu, cu_t):
        dtypes = (x_dtype, w_dtype, b_dtype or w_dtype, cu_t or w_dtype)
        flags = (b_dtype is not None, has_cu, has_hist)
        if quick:  # the strides are arguments
            return FWD_QUICK.prepare(grid, dtypes, (*scalars, *strides), (*flags, cfg.R, cfg.SUB, cfg.BC, width, act),
                                     cfg.num_warps, cfg.maxnreg)
        return FWD.prepare(grid, dtypes, scalars, (*strides, *flags, cfg.R, cfg.SUB, cfg.BC, cfg.stages, width, act),
                           cfg.num_warps, cfg.maxnreg)

    ids = variant(SEGMENT_IDS_VALUE, torch.int32) if _ids_apply(S, C, n_cu) else None
    return ForwardLaunch(variant(cu_dtype is not None, cu_dtype), ids, S)


def triton_forward(x_SC, w_CW, b_C, cu_seqlens, seq_len, y_SC, hist_NHC=None, config=None, activation="silu"):
    """Launch the forward kernel: y_SC <- act(conv(x_SC)), W = w_CW.shape[1]. x_SC, y_SC: unit
    channel stride and row strides that are multiples of 8; w_CW contiguous; hist_NHC: KCP
    history rows [N, W - 1, C] or None."""
    S, C = x_SC.shape
    if S == 0:
        return y_SC
    prepare_forward(S, C, x_SC.stride(0), y_SC.stride(0), x_SC.dtype, w_CW.dtype, *optional_meta(b_C, cu_seqlens),
                    seq_len, hist_NHC is not None, config, width=w_CW.shape[1],
                    activation=activation).run(x_SC, w_CW, b_C, cu_seqlens, y_SC, hist_NHC)
    return y_SC


class TicketCounters:
    """The int32 counters of the backward's tickets (kernels/backward.py): the one-group kernel's, one
    per channel block of a launch, or the group kernel's, one per column block; each 0 when the
    launch starts.

    ``get(ws_F, n, at, in_workspace)``: n counters for a launch on the current device and stream
    whose FP32 workspace is ws_F.

    - Eager: one buffer per device and stream, kept across calls. The kernel sets every counter it
      used back to 0, so the next launch on the same stream (which runs after it) finds them at 0;
      a launch on another stream may run at the same time and has its own buffer.
    - ``in_workspace`` (the custom ops, i.e. under torch.compile) or capturing a CUDA graph: the
      counters are ws_F[at : at + n] (slots the call does not use: one group's group-sum slot, or
      the leaf slots after the nodes), zeroed by a memset first (captured with the kernel). Nothing
      is allocated, and a graph shares its counters with no eager launch and no other graph,
      whatever streams they are replayed on.
      torch.compile's CUDA-graph mode (``mode="reduce-overhead"``) runs its warm-up with every
      allocation routed to the graph's memory pool, where a buffer kept across calls must not live.
    """

    def __init__(self):
        self._buffers: dict = {}

    def get(self, ws_F, n, at, in_workspace=False):
        on_gpu = ws_F.is_cuda and not INTERPRET
        if in_workspace or (on_gpu and torch.cuda.is_current_stream_capturing()):
            tickets = ws_F[at:at + n].view(torch.int32)
            tickets.zero_()
            return tickets
        key = None  # the interpreter: one process-wide buffer (its programs run one after another)
        if on_gpu:
            device = _cuda_getDevice()
            key = (device, _cuda_getCurrentRawStream(device))
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < n:
            buf = torch.zeros(max(n, 64), dtype=torch.int32, device=ws_F.device)
            self._buffers[key] = buf
        return buf


TICKETS = TicketCounters()


class BackwardLaunches:
    """The backward kernels' launches for one operand layout (``prepare_backward``).

    One group of the dweight tree (S <= 8,192, ``leaf_tree``): the one-group main kernel alone,
    which also writes dw / db. Two or more groups: the main kernel, then the group kernel, which
    writes them. ``tickets``: the count and workspace offset of the ticket counters of the kernel
    that writes dw / db.

    ``run(dy_SC, x_SC, w_CW, b_C, cu, dx_SC, ws_F, dw_CW, db_C, hist_NHC=None, fut_NHC=None,
    tickets_in_workspace=False)`` with tensors of the layout it was prepared for; writes dx, dw and
    (if given) db. ``tickets_in_workspace``: see ``TicketCounters`` (the custom ops set it).
    ``early``: as for ``ForwardLaunch``.
    """

    __slots__ = ("main", "ids", "group", "S", "tickets", "early")

    def __init__(self, main: Prepared, ids, group, S: int, tickets):
        self.main, self.ids, self.group, self.S, self.tickets = main, ids, group, S, tickets
        self.early = None

    def run(self, dy_SC, x_SC, w_CW, b_C, cu, dx_SC, ws_F, dw_CW, db_C, hist_NHC=None, fut_NHC=None,
            tickets_in_workspace=False):
        early = self.early
        if early is not None:
            if early.active():
                if not _recording_twins:
                    early.launch.run(dy_SC, x_SC, w_CW, b_C, cu, dx_SC, ws_F, dw_CW, db_C, hist_NHC, fut_NHC,
                                     tickets_in_workspace)
                    return
                _record_twin(early.launch, dy_SC, x_SC, w_CW, b_C, cu, dx_SC, ws_F, dw_CW, db_C, hist_NHC, fut_NHC,
                             tickets_in_workspace)  # then its own below
            else:
                self.early = None
        w = w_CW  # stands in for the absent optional pointers
        b = w if b_C is None else b_C
        hist = w if hist_NHC is None else hist_NHC
        fut = w if fut_NHC is None else fut_NHC
        db = dw_CW if db_C is None else db_C
        if self.ids is not None and use_ids:
            launch, cu_or_ids = self.ids, segment_ids_buffer(cu, self.S)
        else:
            launch, cu_or_ids = self.main, w if cu is None else cu
        n_tickets, at = self.tickets
        tickets = TICKETS.get(ws_F, n_tickets, at, tickets_in_workspace)
        if self.group is None:
            launch.run((x_SC, dy_SC, dx_SC, w, b, cu_or_ids, hist, fut, ws_F, dw_CW, db, tickets))
            return
        launch.run((x_SC, dy_SC, dx_SC, w, b, cu_or_ids, hist, fut, ws_F))
        self.group.run((ws_F, dw_CW, db, tickets))


def prepare_backward(S, C, x_stride, dy_stride, dx_stride, x_dtype, dy_dtype, w_dtype, b_dtype, cu_dtype,
                     n_cu, seq_len, dw_dtype, has_hist=False, has_fut=False, config=None, *, width=TAPS,
                     activation="silu", quick=False) -> BackwardLaunches:
    """The backward launches for S > 0 rows of C channels: row strides (multiples of 8) of x, dy and
    dx (dx has x's dtype), the dtypes of x, dy, w, b (None: no bias; db then has dw's dtype too),
    cu (None: uniform documents of seq_len) and dw; n_cu = cu_seqlens.shape[0]; has_hist /
    has_fut: KCP halo rows given (hist: x's dtype; fut: FP32); the taps' width W and the
    activation ("silu" or None); quick: the main kernels' quick twins (same bits; their own
    configuration, ``config`` is not used)."""
    assert S > 0 and (has_hist or not has_fut)
    act = activation_flag(activation)
    if quick:
        cfg = tuning.pick_quick_configs(INTERPRET, width)[1]
    else:
        cfg = config or tuning.pick_bwd_config(C, x_dtype.itemsize, INTERPRET, has_bias=b_dtype is not None,
                                               width=width)
    n_seg, T = _segments(S, n_cu, seq_len)
    R = cfg.R
    logr = R.bit_length() - 1
    sub, leaves_per_group, log2_leaves_per_group = leaf_tree(width)
    assert 1 << logr == R and R <= leaves_per_group
    n_nodes = cdiv(S, R * sub)
    n_leaves = cdiv(S, sub)
    n_groups = cdiv(n_leaves, leaves_per_group)
    C5 = (width + 1) * C  # partial columns: the taps' and the bias's

    one_group = n_groups == 1
    M = leaves_per_group // R  # level-logr nodes per group
    grid = (n_nodes * cdiv(C, cfg.BC), 1, 1)
    scalars = (S, C // 8, n_seg, T)
    strides = (x_stride // 8, dy_stride // 8, dx_stride // 8)
    # (one group: the last program adds [M, EPI_BC] of the nodes at a time, 32 floats a thread)
    tail = (M, log2_leaves_per_group - logr, min(cfg.BC, 1024 * cfg.num_warps // M)) if one_group else ()

    def variant(has_cu, cu_t):
        dtypes = (x_dtype, dy_dtype, w_dtype, b_dtype or w_dtype, cu_t or w_dtype)
        if one_group:  # + dw, db (dw's dtype) and the int32 tickets
            dtypes = (*dtypes, dw_dtype, torch.int32)
        flags = (b_dtype is not None, has_cu, has_hist, has_fut, R, logr, sub, cfg.BC)
        if quick:  # the strides are arguments
            return (BWD_ONE_GROUP_QUICK if one_group else BWD_QUICK).prepare(
                grid, dtypes, (*scalars, *strides), (*flags, width, act, *tail), cfg.num_warps, cfg.maxnreg)
        return (BWD_ONE_GROUP if one_group else BWD).prepare(
            grid, dtypes, scalars, (*strides, *flags, cfg.stages, cfg.step_branch, width, act, *tail), cfg.num_warps,
            cfg.maxnreg)

    # the nodes are the workspace's first n_nodes * C5 floats, the group sums start at leaf n_leaves
    # dx and hist have x's dtype, fut and the workspace are FP32 (built so)
    main = variant(cu_dtype is not None, cu_dtype)
    ids = variant(SEGMENT_IDS_VALUE, torch.int32) if _ids_apply(S, C, n_cu) else None
    if one_group:  # the main kernel adds the group itself; tickets: one per channel block (TicketCounters),
        # in the workspace at the group sums' slot (one group has none)
        return BackwardLaunches(main, ids, None, S, (cdiv(C, cfg.BC), C5 * n_leaves))
    # the group kernel adds the groups; tickets: one per column block of its grid, in the workspace after
    # the nodes (sized for R = 1 leaves: with R >= 2 at least half the leaf slots stay free)
    blk, warps = (16, 1) if INTERPRET else (_GROUP_BLK, 4)
    n_tickets = cdiv(C5, blk)
    assert n_nodes * C5 + n_tickets <= n_leaves * C5, "the group kernel's counters need R >= 2"
    group = BWD_GROUP.prepare((n_groups, n_tickets, 1), (dw_dtype,), (n_nodes, n_leaves, n_groups, C),
                              (b_dtype is not None, M, log2_leaves_per_group - logr, blk, GROUP_BLOCK, LOG2_GROUP_BLOCK,
                               width),
                              warps)
    return BackwardLaunches(main, ids, group, S, (n_tickets, n_nodes * C5))


def triton_backward(dy_SC, x_SC, w_CW, b_C, cu_seqlens, seq_len, dx_SC, ws_F, dw_CW, db_C,
                    hist_NHC=None, fut_NHC=None, config=None, tickets_in_workspace=False, activation="silu"):
    """Launch the backward kernels (one group: the one-group kernel; else the main and group kernels); writes dx_SC,
    dw_CW and (if given) db_C (dw's dtype).

    W = w_CW.shape[1]; ws_F: FP32 workspace of at least backward_workspace_floats(S, C, W) elements. KCP: hist_NHC
    (and fut_NHC, or None while the look-ahead halo is still in flight: triton_dx_rows then
    rewrites the affected rows). tickets_in_workspace: see ``TicketCounters``.
    """
    S, C = x_SC.shape
    assert db_C is None or db_C.dtype == dw_CW.dtype
    prepare_backward(S, C, x_SC.stride(0), dy_SC.stride(0), dx_SC.stride(0), x_SC.dtype, dy_SC.dtype, w_CW.dtype,
                     *optional_meta(b_C, cu_seqlens), seq_len, dw_CW.dtype, hist_NHC is not None, fut_NHC is not None,
                     config, width=w_CW.shape[1], activation=activation).run(dy_SC, x_SC, w_CW, b_C, cu_seqlens, dx_SC, ws_F, dw_CW, db_C, hist_NHC, fut_NHC,
                                 tickets_in_workspace)
    return dx_SC, dw_CW, db_C


# --------------------------------------------------------------- KCP boundary rows and halos

def _rows_launch_shape():
    """(rows per program, channels per program, warps) of the row-list kernels."""
    return (4, 16, 1) if INTERPRET else (8, 128, 4)


def triton_head_g(dy_SC, x_SC, w_CW, b_C, cu_seqlens, hist_NHC, rows_F, g_FC, activation="silu"):
    """KCP: g_FC[i] <- FP32 g of local row rows_F[i] (segments from cu_seqlens, halo hist_NHC).

    g_FC may be a column slice of a wider buffer (row stride a multiple of 8, unit channel stride).
    """
    S, C = x_SC.shape
    n = rows_F.shape[0]
    if n == 0 or S == 0:
        return g_FC
    rb, bc, nw = _rows_launch_shape()
    b = b_C if b_C is not None else w_CW
    consts = (x_SC.stride(0) // 8, dy_SC.stride(0) // 8, g_FC.stride(0), b_C is not None, rb, bc, w_CW.shape[1],
              activation_flag(activation))
    # hist has x's dtype, g is FP32, rows int64, cu int32 (the KCP plan's)
    BWD_HEAD.launch((cdiv(n, rb), cdiv(C, bc), 1), (x_SC, dy_SC, w_CW, b, cu_seqlens, hist_NHC, rows_F, g_FC),
                    (x_SC.dtype, dy_SC.dtype, b.dtype), (n, S, C // 8, cu_seqlens.shape[0] - 1), consts, nw)
    return g_FC


def triton_forward_rows(x_SC, w_CW, b_C, cu_seqlens, hist_NHC, rows_F, y_SC, activation="silu"):
    """KCP: rewrite y of local rows rows_F (segment starts) with the history halo hist_NHC."""
    S, C = x_SC.shape
    n = rows_F.shape[0]
    if n == 0 or S == 0:
        return y_SC
    rb, bc, nw = _rows_launch_shape()
    b = b_C if b_C is not None else w_CW
    consts = (x_SC.stride(0) // 8, y_SC.stride(0) // 8, b_C is not None, rb, bc, w_CW.shape[1], activation_flag(activation))
    FWD_ROWS.launch((cdiv(n, rb), cdiv(C, bc), 1), (x_SC, y_SC, w_CW, b, cu_seqlens, hist_NHC, rows_F),
                    (x_SC.dtype, b.dtype), (n, S, C // 8, cu_seqlens.shape[0] - 1), consts, nw)
    return y_SC


def triton_dx_rows(dy_SC, x_SC, w_CW, b_C, cu_seqlens, hist_NHC, fut_NHC, rows_F, dx_SC, activation="silu"):
    """KCP: rewrite dx of local rows rows_F (segment ends) with the look-ahead halo fut_NHC."""
    S, C = x_SC.shape
    n = rows_F.shape[0]
    if n == 0 or S == 0:
        return dx_SC
    rb, bc, nw = _rows_launch_shape()
    b = b_C if b_C is not None else w_CW
    consts = (x_SC.stride(0) // 8, dy_SC.stride(0) // 8, dx_SC.stride(0) // 8, b_C is not None, rb, bc, w_CW.shape[1],
              activation_flag(activation))
    BWD_DX_ROWS.launch((cdiv(n, rb), cdiv(C, bc), 1),
                       (x_SC, dy_SC, dx_SC, w_CW, b, cu_seqlens, hist_NHC, fut_NHC, rows_F),
                       (x_SC.dtype, dy_SC.dtype, b.dtype), (n, S, C // 8, cu_seqlens.shape[0] - 1), consts, nw)
    return dx_SC


def triton_halo_gather(out_KC, map_K, local_LC, recv_RC=None):
    """out_KC[i] <- local_LC[map[i]] (map >= 0), recv_RC[-2 - map[i]] (map <= -2), or 0 (map == -1).

    Any row strides, unit channel strides; out_KC may be a column slice of a wider buffer, and so
    may local_LC and recv_RC (kernels/halo.py).
    """
    K, C = out_KC.shape
    if K == 0 or C == 0:
        return out_KC
    rb, bc, nw = (4, 16, 1) if INTERPRET else (4, 256, 4)
    recv = recv_RC if recv_RC is not None else local_LC
    HALO_GATHER.launch((cdiv(K, rb), cdiv(C, bc), 1), (out_KC, map_K, local_LC, recv), (out_KC.dtype, local_LC.dtype),
                       (K, C, out_KC.stride(0), local_LC.stride(0), recv.stride(0)), (recv_RC is not None, rb, bc), nw)
    return out_KC
