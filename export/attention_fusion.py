"""An ONNX graph pass: each attention core of an exported graph becomes one onnxruntime
`com.microsoft.MultiHeadAttention` node (a fused kernel: scores, bias, softmax and the value
product in one pass, no [B, H, L, L] tensors between operators).

What it matches, per Softmax node (the decomposition torch.onnx writes for
`F.scaled_dot_product_attention` with an additive mask, training/models/attention.py `_fused`):

    P = Softmax(MatMul(Mul(Q, c1), Mul(K^T, c2)) + bias)      Q, K: [B, H, L, dq]
    out = MatMul(P, V)                                        V: [B, H, L, dv], out: [B, H, L, dv]

with c1, c2 scalar constants and K^T a transpose of K's last two axes. It writes

    out = Transpose(Reshape(MHA(q3, k3, v3, attention_bias=bias), [B, L, H, dv]), BHLd)
    x3  = Reshape(Transpose(x, BLHd), [B, L, H * d]) for x in Q, K, V

scale = c1 * c2, num_heads = H. What each attention kind gives:
- standard, RouterKT (head weights multiply `out` afterwards, untouched), the content part of
  relative attention (its recency mixture reads V and `out` afterwards): fused;
- ALiBi: its slopes ride in one extra query/key channel (dq = dv + 1), which the op accepts in the
  3-D layout: fused;
- monotonic (AKT decay): its scores are multiplied by a decay before the softmax, no pattern to
  fuse: the plain operators stay, and `FusionReport.plain` says so (the export log prints it).
- the rank graph's cores over history keys plus each query's own slot (SequenceContext's rank
  layout, [L, H + 1] scores, cheaper than the [L, L] a fused kernel would take): plain, reported;
  its value encoders run in the window layout over the history and fuse as above.
Outputs are unchanged up to float rounding; the export's parity checks run on the fused graph.
onnxruntime only: TensorRT plans are built from the plain graph.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
RANK_LAYOUT = "rank layout: history keys plus each query's own slot"


@dataclass
class FusionReport:
    fused: int = 0                                   # attention cores now one MultiHeadAttention node
    plain: list[str] = field(default_factory=list)   # attention cores left as plain operators, with why

    def describe(self) -> str:
        total = self.fused + len(self.plain)
        text = f"fused attention: {self.fused} of {total} attention cores -> {MS_DOMAIN}.MultiHeadAttention"
        if self.plain:
            reasons = sorted(set(self.plain))
            text += f"; {len(self.plain)} kept as plain operators ({'; '.join(reasons)})"
        return text


@dataclass
class _Core:
    product: onnx.NodeProto                          # P @ V: its output `out` is what the fused node writes
    q: str
    k: str
    v: str
    bias: str
    out: str
    scale: float
    heads: int


class _Graph:
    """Producer / consumer / constant / rank lookups over one graph."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.constants = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
                       for v in [*g.value_info, *g.input, *g.output] if v.type.tensor_type.HasField("shape")}

    def op(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        return float(value) if value is not None and value.size == 1 else None

    def rank4(self, name: str) -> list[int | None] | None:
        shape = self.shapes.get(name)
        return shape if shape is not None and len(shape) == 4 else None


def _scaled(g: _Graph, name: str) -> tuple[str, float] | None:
    """Mul(x, c) or Mul(c, x) with a scalar constant c -> (x, c)."""
    mul = g.op(name, "Mul")
    if mul is None:
        return None
    for x, c in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        value = g.scalar(c)
        if value is not None:
            return x, value
    return None


def _untransposed(g: _Graph, name: str) -> str | None:
    """K for K^T written as Transpose(K, [0, 1, 3, 2]) or Reshape -> Transpose([0, 2, 1]) -> Reshape."""
    node = g.op(name, "Transpose")
    if node is not None and list(node.attribute[0].ints) == [0, 1, 3, 2]:
        return node.input[0]
    outer = g.op(name, "Reshape")
    middle = g.op(outer.input[0], "Transpose") if outer is not None else None
    inner = g.op(middle.input[0], "Reshape") if middle is not None else None
    if inner is not None and list(middle.attribute[0].ints) == [0, 2, 1]:
        return inner.input[0]
    return None


def _rank_layout(g: _Graph, probs: str, steps: int = 4) -> bool:
    """Whether `probs` reaches, through a few elementwise ops (row zeroing, the relative mixture), a
    Slice whose result multiplies 4-D values: the rank layout's P[.., :H] @ V_history + P[.., H:] * V."""
    frontier = [probs]
    for _ in range(steps):
        following = []
        for name in frontier:
            for node in g.consumers.get(name, []):
                if node.op_type == "Slice" and any(m.op_type == "MatMul" and g.rank4(m.input[1]) is not None
                                                   for m in g.consumers.get(node.output[0], [])):
                    return True
                if node.op_type in ("Mul", "Add", "Div"):
                    following.append(node.output[0])
        frontier = following
    return False


def _match(g: _Graph, softmax: onnx.NodeProto) -> tuple[_Core | None, str | None]:
    """The attention core around `softmax`, or (None, why not) when it is attention that cannot be
    fused, or (None, None) when it is no attention core (a router's softmax, AKT's detached one)."""
    axis = [a.i for a in softmax.attribute if a.name == "axis"]
    readers = g.consumers.get(softmax.output[0], [])
    if _rank_layout(g, softmax.output[0]):
        return None, RANK_LAYOUT
    if len(readers) != 1 or readers[0].op_type != "MatMul" or readers[0].input[0] != softmax.output[0]:
        return None, None
    product = readers[0]
    v_shape = g.rank4(product.input[1])
    if v_shape is None:
        return None, None                             # P @ constant: not attention over values
    if axis and axis[0] not in (-1, 3):
        return None, "softmax not over the keys"
    add = g.op(softmax.input[0], "Add")
    if add is None:
        return None, "scores are not Q K^T + bias (monotonic decay)"
    for scores, bias in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        matmul = g.op(scores, "MatMul")
        if matmul is None:
            continue
        left, right = _scaled(g, matmul.input[0]), _scaled(g, matmul.input[1])
        if left is None or right is None:
            continue
        key = _untransposed(g, right[0])
        if key is None:
            continue
        q, k, v = left[0], key, product.input[1]
        q_shape, k_shape = g.rank4(q), g.rank4(k)
        if q_shape is None or k_shape is None:
            continue
        heads = {q_shape[1], k_shape[1], v_shape[1]}
        if len(heads) != 1 or None in heads or q_shape[3] is None or q_shape[3] != k_shape[3] or v_shape[3] is None:
            return None, "head counts or head sizes not static"
        if g.rank4(bias) is None:
            return None, "the additive bias is not 4-D [B or 1, H or 1, L, L]"
        return _Core(product=product, q=q, k=k, v=v, bias=bias, out=product.output[0],
                     scale=left[1] * right[1], heads=heads.pop()), None
    return None, "scores are not Q K^T + bias (monotonic decay)"


def _rewrite(model: onnx.ModelProto, core: _Core, index: int) -> None:
    g = model.graph
    p = f"fused_attention_{index}"
    flat = numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), f"{p}/flat_shape")
    heads = numpy_helper.from_array(np.array([0, 0, core.heads, -1], dtype=np.int64), f"{p}/head_shape")
    g.initializer.extend([flat, heads])
    new = []
    flat_inputs = []
    for role, name in (("q", core.q), ("k", core.k), ("v", core.v)):
        new.append(helper.make_node("Transpose", [name], [f"{p}/{role}_blhd"], perm=[0, 2, 1, 3], name=f"{p}/{role}_t"))
        new.append(helper.make_node("Reshape", [f"{p}/{role}_blhd", flat.name], [f"{p}/{role}3"], name=f"{p}/{role}_r"))
        flat_inputs.append(f"{p}/{role}3")
    new.append(helper.make_node("MultiHeadAttention", [*flat_inputs, "", "", core.bias], [f"{p}/out3"],
                                domain=MS_DOMAIN, num_heads=core.heads, scale=core.scale, name=f"{p}/mha"))
    new.append(helper.make_node("Reshape", [f"{p}/out3", heads.name], [f"{p}/out_blhd"], name=f"{p}/out_r"))
    new.append(helper.make_node("Transpose", [f"{p}/out_blhd"], [core.out], perm=[0, 2, 1, 3], name=f"{p}/out_t"))
    # the new nodes take the place of P @ V (every input of the core is computed before it); the
    # score operators before it are left unread and pruned afterwards
    position = list(g.node).index(core.product)
    g.node.remove(core.product)                       # its output is now written by the new Transpose
    for offset, node in enumerate(new):
        g.node.insert(position + offset, node)


def _prune(model: onnx.ModelProto) -> None:
    """Drop nodes whose outputs nobody reads (the replaced score operators), then unused constants."""
    g = model.graph
    needed = {o.name for o in g.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
            for a in node.attribute:                 # subgraphs (If / Loop) read outer names too
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []):
                    needed.update(i for n in sub.node for i in n.input)
    del g.node[:]
    g.node.extend(reversed(kept))
    unused = [i for i in g.initializer if i.name not in needed]
    for i in unused:
        g.initializer.remove(i)


def fuse_attention(model: onnx.ModelProto) -> FusionReport:
    """Rewrite `model` in place (see the module docstring); returns what was fused and what was not."""
    report = FusionReport()
    g = _Graph(model)
    cores = []
    for node in list(model.graph.node):
        if node.op_type != "Softmax":
            continue
        core, why = _match(g, node)
        if core is not None:
            cores.append(core)
        elif why is not None:
            report.plain.append(why)
    for index, core in enumerate(cores):
        _rewrite(model, core, index)
    if cores:
        _prune(model)
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    report.fused = len(cores)
    return report


def fuse_attention_file(source, target) -> FusionReport:
    """`fuse_attention` from one .onnx file to another (weights embedded, as the exporter writes)."""
    model = onnx.load(str(source))
    report = fuse_attention(model)
    onnx.save(model, str(target))
    return report
