"""``hpctrain bench``'s configurations: one typed dataclass per kind of benchmark, its command
line generated from it (:mod:`hpctrain.options`)."""

from dataclasses import dataclass

from ..options import check, option
from ..units import parse_size

DTYPES = "float16, bfloat16, float32, float64, int32 or int64"
OPS = "sum, avg, min, max or prod"
DEVICES = ("cpu", "cuda")
#: torch's backend that ``bench torch-distributed`` times beside hpctrain's, per device.
AGAINST = {"cpu": "gloo", "cuda": "nccl"}


def _sizes(text):
    # The text as given (the benchmark reads it), once every size in it has parsed.
    for size in text.split(","):
        parse_size(size)
    return text


@dataclass
class SizeSweep:
    """A sweep of message sizes, nccl-tests' way (``bench p2p``; every collective's base)."""

    minbytes: int = option(8, "smallest size in bytes, e.g. 8, 64K (default: {default})",
                           flags=("-b", "--minbytes"), parse=parse_size, example="8")
    maxbytes: int = option(64 << 20, "largest size in bytes, e.g. 16M (default: {default})",
                           flags=("-e", "--maxbytes"), parse=parse_size, shown="64M",
                           example="16M")
    stepfactor: int = option(2, "multiply the size by this factor each step (default: "
                                "{default})", flags=("-f", "--stepfactor"), minimum=1)
    iters: int = option(20, "timed iterations per size (default: {default})",
                        flags=("-n", "--iters"), minimum=1)
    warmup: int = option(5, "untimed warm-up iterations per size (default: {default})",
                         flags=("-w", "--warmup"), minimum=0)
    json: str = option(None, "also write the results as JSON", metavar="FILE",
                       example="results.json")
    hdf5: str = option(None, "also write the results as HDF5", metavar="FILE",
                       example="results.h5")

    def __post_init__(self):
        check(self)


@dataclass
class CollectiveBench(SizeSweep):
    """``bench <collective>``: the sweep, the algorithms, the check, the data."""

    algos: str = option("", "algorithms to compare (default: all available)",
                        metavar="A,B,...", example="ring,tree")
    check: int = option(1, "check results in a separate pass (default: {default})",
                        flags=("-c", "--check"), choices=(0, 1))
    dtype: str = option("float32", DTYPES, flags=("-d", "--dtype"))
    op: str = option("sum", OPS, flags=("-o", "--op"))
    device: str = option("cpu", "where the buffers live (cuda: one GPU per local rank)",
                         choices=DEVICES)


@dataclass
class RootedBench(CollectiveBench):
    """``bench <collective>`` of a collective with a root (broadcast, reduce)."""

    root: int = option(0, "the root rank (default: {default})", flags=("-r", "--root"),
                       minimum=0)


@dataclass
class TorchDistributedBench:
    """``bench torch-distributed``: hpctrain's ``torch.distributed`` backend beside torch's."""

    sizes: str = option("1M,16M,64M", "message sizes in bytes, comma-separated (default: "
                                      "{default})", parse=_sizes)
    rounds: int = option(5, "alternated rounds; the table gives their median (default: "
                            "{default})", minimum=1)
    iters: int = option(3, "timed calls per collective, size and round (default: {default})",
                        flags=("-n", "--iters"), minimum=1)
    train_steps: int = option(10, "DDP and FSDP2 training steps per round (default: "
                                  "{default}; 0: no training rows; --ddp-steps is its old "
                                  "name)", flags=("--train-steps", "--ddp-steps"), minimum=0)
    device: str = option("cpu", "where the tensors live (default: {default}; cuda: each "
                                "rank's node-local GPU)", choices=tuple(AGAINST))
    against: str = option(None, "torch's backend to time beside hpctrain (default: gloo on "
                                "cpu, nccl on cuda; none: hpctrain alone)",
                          choices=(*sorted(set(AGAINST.values())), "none"))
    json: str = option(None, "also write the results as JSON", metavar="FILE",
                       example="results.json")

    def __post_init__(self):
        check(self)

