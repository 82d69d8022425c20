"""``hpctrain data``: write the data sets that ``hpctrain train`` reads.

Only rank 0 writes (a file is published atomically, so a launch under mpirun is harmless);
this subcommand never initialises MPI.
"""

from ..runtime import launcher_rank
from . import digits, synthetic

DESCRIPTION = """\
Write a data set into HDF5 (datasets 'x': float32 samples, 'y': int64 labels):

  python -m hpctrain data prepare digits [--out data/digits.h5]
  python -m hpctrain data synthetic --samples 60000 --shape 1x28x28 --classes 10 \\
      --out data/synthetic.h5

'hpctrain train' prepares the digits by itself on first use.
"""


def add_parser(subparsers):
    """Register the ``data`` subcommand and its actions ``prepare`` and ``synthetic``."""
    import argparse

    parser = subparsers.add_parser(
        "data", help="write data sets into HDF5 (digits, synthetic)", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    prepare = actions.add_parser("prepare", help="write a bundled data set into HDF5",
                                 description="Write a bundled data set (no download) into HDF5.")
    prepare.add_argument("dataset", choices=["digits"], help="the data set to write")
    prepare.add_argument("--out", default=digits.DEFAULT_PATH,
                         help=f"output file (default: {digits.DEFAULT_PATH})")
    prepare.set_defaults(func=run_prepare)
    synth = actions.add_parser(
        "synthetic", help="write a synthetic classification data set",
        description="Write class prototypes plus Gaussian noise: learnable data of any size.")
    synth.add_argument("--samples", type=int, required=True, help="number of rows")
    synth.add_argument("--shape", default="1x28x28", help="sample shape (default: 1x28x28)")
    synth.add_argument("--classes", type=int, default=10, help="number of classes (default: 10)")
    synth.add_argument("--noise", type=float, default=1.0,
                       help="noise standard deviation around each class prototype (default: 1)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    synth.add_argument("--out", required=True, help="output file")
    synth.set_defaults(func=run_synthetic)
    return parser


def run_prepare(args):
    """Write the bundled data set named on the command line (rank 0 only)."""
    if launcher_rank() == 0:
        path = digits.prepare(args.out)
        print(f"wrote {path}: 1797 samples of 1x8x8, 10 classes", flush=True)
    return 0


def run_synthetic(args):
    """Write the synthetic data set described on the command line (rank 0 only)."""
    shape = synthetic.parse_shape(args.shape)
    if launcher_rank() == 0:
        path = synthetic.write(args.out, args.samples, shape, args.classes, seed=args.seed,
                               noise=args.noise)
        print(f"wrote {path}: {args.samples} samples of {'x'.join(map(str, shape))}, "
              f"{args.classes} classes", flush=True)
    return 0
