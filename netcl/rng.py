"""netcl's random generator: initial weights, dropout masks, randn, shuffling. manual_seed seeds
it; checkpoints save its state."""
import numpy as np

_rng = np.random.default_rng()


def manual_seed(seed):
    """Seed parameter initialisation, dropout masks and netcl.randn."""
    global _rng
    _rng = np.random.default_rng(seed)


def rng():
    """netcl's random generator (initial weights, dropout masks; checkpoints save its state)."""
    return _rng


def set_rng(generator):
    """Replace netcl's generator (a numpy Generator; checkpoints restore theirs)."""
    global _rng
    _rng = generator
