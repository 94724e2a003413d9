"""``minidl gradcheck``: every op's backward against float64 central finite differences.

    minidl gradcheck                 every op case of minidl.op_cases, one row each
    minidl gradcheck --only relu matmul
    minidl gradcheck --adjoint       the tangent rules: J v against differences, the adjoint test
    minidl gradcheck --sweep tanh    the error against the step, drawn (central, Richardson, complex step)
"""
from __future__ import annotations

import difflib
import sys

from minidl.cli.args import add_command, out_folder


def gradcheck_command(args) -> int:
    """Check every op in minidl.op_cases; print a table; exit 1 if any fails."""
    from minidl.gradcheck import ADJOINT_ULPS, forward_mode_errors, max_relative_error
    from minidl.op_cases import cases

    rows, failed = [], 0
    every = cases(args.seed)
    asked = list(args.only or ()) + ([args.sweep] if args.sweep else [])
    unknown = [name for name in asked if name not in {c[0] for c in every}]
    if unknown:
        names = sorted({c[0] for c in every})
        for name in unknown:
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
            print(f"minidl gradcheck: error: no op case named {name!r}; "
                  + (f"the closest: {', '.join(close)}" if close else f"the op cases: {', '.join(names)}"),
                  file=sys.stderr)
        return 2
    if args.sweep:  # the error against the step for one op, drawn
        from minidl.gradcheck import sweep_op_case
        with out_folder("gradcheck", args.out) as folder:
            sweep, path = sweep_op_case(args.sweep, folder.path, args.seed)
        print(f"{sweep}\nwrote {path}")
        return 0
    for name, fn, inputs in every:
        if args.only and name not in args.only:
            continue
        shapes = " ".join("x".join(map(str, x.shape)) or "()" for x in inputs)
        try:
            if args.adjoint:  # err: the tangent rules against central differences; the adjoint test in ulps
                ulps, err = forward_mode_errors(fn, inputs, eps=args.eps, seed=args.seed)
                ok = err <= args.tolerance and ulps <= ADJOINT_ULPS
                shapes = f"adjoint {ulps:5.2f} ulps  " + shapes
            else:
                err = max_relative_error(fn, inputs, eps=args.eps)
                ok = err <= args.tolerance
        except Exception as exc:  # an op that raises is a failure to report, not a crash
            err, ok = float("nan"), False
            shapes += f"  ({type(exc).__name__}: {exc})"
        failed += not ok
        rows.append((name, shapes, err, ok))
    width = max(len(r[0]) for r in rows)
    print(f"{'op':<{width}}  {'max rel. error':>14}  {'pass':<4}  inputs")
    for name, shapes, err, ok in rows:
        print(f"{name:<{width}}  {err:>14.2e}  {'yes' if ok else 'NO':<4}  {shapes}")
    print(f"\n{len(rows) - failed} passed, {failed} failed (float64 central differences, eps={args.eps:g}"
          + (f"; forward mode: J v from the tangent rules, and ⟨u, J v⟩ = ⟨Jᵀu, v⟩ to {ADJOINT_ULPS} ulps)"
             if args.adjoint else ")"))
    return 1 if failed else 0


def add_commands(subparsers) -> None:
    """Register ``gradcheck`` with the ``minidl`` command's subparsers."""
    p = add_command(subparsers, "gradcheck", help="check every op's backward against finite differences",
                    description="Check every op's backward against float64 central finite differences and print "
                                "a table:\none row per op case (minidl.op_cases), its largest relative error, and "
                                "whether it passes.\nExits 1 if any op fails.")
    p.add_argument("--eps", type=float, default=1e-6, help="finite-difference step")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative error that passes")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--adjoint", action="store_true", help="check the tangent rules (forward mode) instead: J v "
                   "against central differences, and the adjoint test ⟨u, J v⟩ = ⟨Jᵀu, v⟩ against the backward")
    p.add_argument("--only", nargs="*", metavar="OP", help="check only these ops; an unknown name exits 2 with "
                   "the closest names (default: every op)")
    p.add_argument("--sweep", metavar="OP", help="instead of the table: draw OP's derivative error against the "
                   "step h (1e-1 to 1e-13) for central differences, Richardson and the complex step, with the "
                   "theory's lines, to OUT/sweep_OP.png (default: the table)")
    p.add_argument("--out", metavar="DIR", help="folder for the --sweep figure (default: runs/gradcheck-<time>)")
    p.set_defaults(run=gradcheck_command)
