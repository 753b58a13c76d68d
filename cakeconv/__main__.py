"""``python -m cakeconv demo``: see cakeconv/demo.py."""

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("demo",):
        print("usage: python -m cakeconv demo [--tokens N] [--channels C] [--ranks P]\n"
              "  runs the single-rank op (both backends) and the context-parallel op (every layout)\n"
              "  on random packed batches and checks them against the float64 oracle / single-rank op")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
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
