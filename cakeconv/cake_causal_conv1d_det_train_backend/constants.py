"""Constants shared by the kernels, their launchers and the KCP programs (each defined once here).

- ``TAPS``: the convolution width W = 4 (``weight[:, 3]`` multiplies the current token).
- ``HALO_ROWS``: H = W - 1 = 3, the rows a token reads before it (forward) and whose gradient it
  reads after it (backward); the rows a KCP halo carries per segment and direction.
- ``INTERPRET``: Triton's CPU interpreter is on (``TRITON_INTERPRET=1``). Triton reads the variable
  when it is imported, so it must be set before the first import of triton; it is read once here.
"""

import os

TAPS = 4
HALO_ROWS = TAPS - 1
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
