"""The architecture's rules, checked on the source tree (engineering.md): no host function with more than 8
parameters below the public API, no import cycle between modules, no import between op folders other than
from ops/common, no file over 600 lines."""
import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "tileattn"
MAX_PARAMS, MAX_LINES = 8, 600
# The public entry points keep the signatures users know (FlashAttention's and torch's keyword options, documented
# in their docstrings); everything below them takes a problem object.
PUBLIC = {("ops/dense/api.py", "attention"), ("ops/dense/api.py", "varlen_attention"),
          ("ops/flex/api.py", "flex_attention"), ("ops/mla/api.py", "mla_decode"),
          ("ops/mla/plan.py", "__init__"), ("ops/mla/plan.py", "run"), ("ops/decode/api.py", "kvcache_attention"),
          ("ops/decode/plan.py", "__init__"), ("ops/decode/plan.py", "run")}
# the edges between op folders: dense's Sq = 1 route runs the decode op's plan (ops/dense/launch_decode.py); the
# ring (ops/distributed/ring.py) runs the dense op on each K/V block: its forward through the public attention,
# its backward through dense's launch (bwd.attn_bwd) with the ring's merged out and lse (the registered
# tileattn::attn_bwd would cost ~0.1 ms of dispatch per block on the H100 host), and dense's input checks
ALLOWED_EDGES = {("dense", "decode"), ("distributed", "dense")}


def _modules():
    mods = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        mods[name] = (path, ast.parse(path.read_text()))
    return mods


MODULES = _modules()


def _is_jit(fn):
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _n_params(fn):
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def _imports(name, path, tree):
    """(module imported, imported name) pairs of module `name`, relative imports resolved."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield (full if full in MODULES else target), alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None


def _op(module):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "ops" else None


def test_host_functions_take_few_parameters():
    long = []
    for path, tree in MODULES.values():
        rel = str(path.relative_to(SRC))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_jit(node):
                if _n_params(node) > MAX_PARAMS and (rel, node.name) not in PUBLIC:
                    long.append(f"{rel}:{node.lineno} {node.name} ({_n_params(node)})")
    assert not long, f"host functions with more than {MAX_PARAMS} parameters: {long}"


def test_no_import_cycles():
    graph = {name: {m for m, _ in _imports(name, *MODULES[name]) if m in MODULES} for name in MODULES}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"
    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles: {cycles}"


def test_ops_import_only_common_from_each_other():
    bad = []
    for name, (path, tree) in MODULES.items():
        for module, imported in _imports(name, path, tree):
            src, dst = _op(name), _op(module)
            if src and dst and src != dst and dst != "common" and (src, dst) not in ALLOWED_EDGES:
                bad.append(f"{name} imports {module}.{imported}")
            elif src and dst and src != dst and imported and imported.startswith("_"):
                bad.append(f"{name} imports the private {module}.{imported}")
    assert not bad, bad


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_files_stay_short(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES
