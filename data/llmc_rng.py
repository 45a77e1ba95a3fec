"""llm.c's random numbers for data order: the mt19937 of its `llmc/rand.h` and its `random_permutation`.

llm.c seeds the generator with the reference Mersenne Twister initialization (`init_genrand`, as PyTorch's
`manual_seed` does) and draws raw 32-bit outputs; numpy's MT19937 engine is that same generator, so only the
seeding and the permutation's draw order are written out here.
"""

from __future__ import annotations

import numpy as np

_STATE_WORDS = 624


class Mt19937:
    """llm.c's `mt19937_state` after `manual_seed(seed)`: `next_u32` yields what its `randint32` yields."""

    def __init__(self, seed: int):
        key = [seed & 0xFFFFFFFF]
        for j in range(1, _STATE_WORDS):  # init_genrand
            key.append((1812433253 * (key[-1] ^ (key[-1] >> 30)) + j) & 0xFFFFFFFF)
        self._engine = np.random.MT19937()
        # pos = 624: the state is regenerated before the first output, as after llm.c's manual_seed
        self._engine.state = {"bit_generator": "MT19937",
                              "state": {"key": np.array(key, dtype=np.uint32), "pos": _STATE_WORDS}}

    def next_u32(self, n: int) -> np.ndarray:
        """The next n outputs, in order."""
        return self._engine.random_raw(n).astype(np.uint32)

    def skip(self, n: int) -> None:
        """Advance past n outputs without keeping them."""
        self._engine.random_raw(n, output=False)


def random_permutation(items: list, rng: Mt19937) -> None:
    """Shuffle `items` in place exactly as llm.c's `random_permutation`: Fisher-Yates from the back, the swap
    partner of position i drawn as randint32 % (i + 1); n - 1 draws for n items."""
    draws = rng.next_u32(max(len(items) - 1, 0)).tolist()
    for i, draw in zip(range(len(items) - 1, 0, -1), draws):
        j = draw % (i + 1)
        items[i], items[j] = items[j], items[i]
