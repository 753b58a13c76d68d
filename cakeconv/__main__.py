"""``python -m cakeconv demo`` (cakeconv/demo.py) and ``python -m cakeconv warmup`` (cakeconv/warmup.py)."""

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("demo", "warmup"):
        print("usage: python -m cakeconv demo [--tokens N] [--channels C] [--ranks P]\n"
              "  runs the single-rank op (both backends) and the context-parallel op (every layout)\n"
              "  on random packed batches and checks them against the float64 oracle / single-rank op\n"
              "       python -m cakeconv warmup --channels C[,C...] [--dtype ...] [--width ...] [--target sm_90] ...\n"
              "  compiles the kernels those problems' training steps launch into Triton's cache, in parallel\n"
              "  (python -m cakeconv warmup --help)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "warmup":
        from .warmup import main as warmup_main

        return warmup_main(argv[1:])
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton reads TRITON_INTERPRET when the kernels are defined (at import): restart with it set
        # so that the Triton kernels run in its CPU interpreter.
        print("(no GPU: restarting with TRITON_INTERPRET=1 so the Triton kernels run on the CPU)", flush=True)
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, "-m", "cakeconv"] + argv, env)
    from .demo import main as demo_main

    return demo_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
