"""printMath in nvFuser's format: inputs, outputs, then %kernel_math."""

from __future__ import annotations


def format_math(inputs, outputs, exprs) -> str:
    lines = ["Inputs:"]
    lines += [f"  {v}" for v in inputs]
    lines.append("Outputs:")
    lines += [f"  {v}" for v in outputs]
    text = "\n".join(lines) + "\n\n%kernel_math {\n"
    for expr in exprs:
        # scalar arithmetic prints too, as in nvFuser (size() prints nothing: it is an extent)
        text += str(expr)
    return text + "} // %kernel_math \n\n"


def print_math(fusion) -> str:
    return format_math(fusion.inputs(), fusion.outputs(), fusion.exprs)
