"""Element-wise chains in a traced graph: the element-wise operations a GraphModule's eval-mode
replay runs as one generated kernel each group (netcl.jit.chain) instead of one kernel per
operation. Device-free: it reads the node list only."""
import math

from netcl.act import Act
from netcl.jit.chain import BINARY, MAX_INPUTS, UNARY, Chain, act_step

# operation -> the activation code of its first argument (the rest: defaults only, or a slope)
_ACTS = {"relu": Act.RELU, "sigmoid": Act.SIGMOID, "tanh": Act.TANH, "F.relu": Act.RELU, "F.relu6": Act.RELU6,
         "F.silu": Act.SILU, "F.hardswish": Act.HARDSWISH, "F.hardsigmoid": Act.HARDSIGMOID,
         "F.sigmoid": Act.SIGMOID, "F.tanh": Act.TANH}


class ChainGroup:
    """Nodes `members` (ascending; `root` the last, whose value the chain computes) run as `chain` on
    the values `inputs` (encoded references) and the numbers `scalars`."""

    def __init__(self, root, members, chain, inputs, scalars):
        self.root, self.members, self.chain = root, tuple(members), chain
        self.inputs, self.scalars = tuple(inputs), tuple(scalars)


def _number(a):
    """An encoded argument as a float where it is a number, else None."""
    if isinstance(a, bool):
        return None
    if isinstance(a, (int, float)):
        return float(a)
    if isinstance(a, dict) and set(a) == {"inf"}:
        return math.inf * a["inf"]
    return None


def _is_ref(a):
    return isinstance(a, dict) and "v" in a


def elementwise(node):
    """(operation, operands) of an element-wise node (operation: a BINARY or UNARY key, or
    ("act", code, slope)); operands each a value reference or a float; None for any other node."""
    op, args, kwargs = node["op"], node.get("args", []), node.get("kwargs", {})
    if not isinstance(args, list):
        return None
    if op in BINARY and len(args) == 2 and not kwargs:
        ops = [a if _is_ref(a) else _number(a) for a in args]
        return (op, ops) if None not in ops and any(_is_ref(a) for a in ops) else None
    if not args or not _is_ref(args[0]):
        return None
    if op in UNARY and len(args) == 1 and not kwargs:
        return op, [args[0]]
    if op in _ACTS:
        rest = list(args[1:]) + list(kwargs.values())
        return (("act", _ACTS[op], 0.0), [args[0]]) if all(a is False for a in rest) else None
    if op == "F.leaky_relu":
        slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
        extra = args[2:] + [v for k, v in kwargs.items() if k != "negative_slope"]
        if _number(slope) is None or any(a is not False for a in extra):
            return None
        return ("act", Act.LEAKY_RELU, _number(slope)), [args[0]]
    if op == "F.gelu":
        approximate = args[1] if len(args) > 1 else kwargs.get("approximate", "none")
        code = {"none": Act.GELU, "tanh": Act.GELU_TANH}.get(approximate)
        return (("act", code, 0.0), [args[0]]) if code is not None and len(args) + len(kwargs) <= 2 else None
    if op == "activation" and not kwargs and 2 <= len(args) <= 3 and type(args[1]) is int \
            and args[1] in set(Act) and (len(args) == 2 or _number(args[2]) is not None):
        return ("act", Act(args[1]), _number(args[2]) if len(args) == 3 else 0.0), [args[0]]
    return None


def chains(nodes, users, skip):
    """The ChainGroups of the graph `nodes` (users: value -> the nodes that use it), leaving out the
    nodes in `skip`: each a maximal set of at least two element-wise nodes of one output shape
    whose values, but the last one's, are used inside it only."""
    ew = {i: e for i, n in enumerate(nodes) if i not in skip and (e := elementwise(n)) is not None}
    taken, out = set(), []
    for root in sorted(ew, reverse=True):
        if root in taken:
            continue
        shape = nodes[root].get("out")
        group, grew = {root}, True
        while grew:  # take a producer once every node that uses it is in the group
            grew = False
            for i in sorted(group):
                for a in ew[i][1]:
                    p = a["v"] if _is_ref(a) and "k" not in a else None
                    if p is None or p in group or p in taken or p not in ew or nodes[p].get("out") != shape:
                        continue
                    if all(u in group for u in users.get(p, [])):
                        group.add(p)
                        grew = True
        if len(group) < 2:
            continue
        made = _chain(nodes, ew, sorted(group))
        if made is not None:
            taken |= group
            out.append(made)
    return sorted(out, key=lambda g: g.root)


def _chain(nodes, ew, members):
    """The ChainGroup of these nodes (ascending), or None past MAX_INPUTS inputs."""
    step_of = {i: j for j, i in enumerate(members)}
    inputs, scalars, steps = [], [], []
    for i in members:
        (op, operands) = ew[i]
        refs = []
        for a in operands:
            if not _is_ref(a):
                scalars.append(a)
                refs.append(("s", len(scalars) - 1))
            elif "k" not in a and a["v"] in step_of:
                refs.append(("t", step_of[a["v"]]))
            else:
                if a not in inputs:
                    inputs.append(a)
                refs.append(("in", inputs.index(a)))
        if isinstance(op, tuple):
            slope = None
            if op[1] == Act.LEAKY_RELU:
                scalars.append(op[2])
                slope = ("s", len(scalars) - 1)
            steps.append(act_step(op[1], refs[0], slope))
        else:
            steps.append((op, tuple(refs)))
    if not 0 < len(inputs) <= MAX_INPUTS:
        return None
    return ChainGroup(members[-1], members, Chain(steps, len(inputs), len(scalars)), inputs, scalars)
