"""The import graph of the radixlm package: circles and imports that run back up.

    python scripts/import_graph.py            # the summary (docs/architecture.md quotes it)
    python scripts/import_graph.py --edges    # every upward import with its line

Every `from radixlm... import` / `import radixlm...` counts: at module level, inside
functions and under `if TYPE_CHECKING:` alike. A *circle* is a set of modules that
import each other (a strongly connected component of more than one module). An
*upward import* is one from a lower floor to a higher one, floors as FLOORS lists
them (a module's floor is its longest matching prefix); imports within one floor are
free. ALLOWED_UPWARD names the upward imports that stay, with their reasons;
tests/test_import_graph.py holds the package to this.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict

# Lowest floor first: each floor may import those below it. A package's floor is its
# longest matching prefix, so a module can sit apart from its package (docs/architecture.md
# says why for each one that does).
FLOORS: list[tuple[str, list[str]]] = [
    ("base", ["radixlm.utils", "radixlm.envs", "radixlm.messages"]),
    ("config", ["radixlm.server_args", "radixlm.default_model"]),
    ("kernels", ["radixlm.layers.cpu_kernels", "radixlm.layers.kernel_build"]),
    ("building blocks", ["radixlm.distributed.parallel_state", "radixlm.distributed.step_sync",
                         "radixlm.model_executor.forward_batch", "radixlm.sampling",
                         "radixlm.mem_cache", "radixlm.layers", "radixlm.constrained",
                         "radixlm.reasoning", "radixlm.function_call", "radixlm.chat_template",
                         "radixlm.tokenizer_utils", "radixlm.multimodal", "radixlm.metrics",
                         "radixlm.detokenizer", "radixlm.speculative"]),
    ("models", ["radixlm.model_loader", "radixlm.models", "radixlm.model_executor"]),
    ("processes", ["radixlm.scheduler", "radixlm.tokenizer", "radixlm.distributed"]),
    ("runtime", ["radixlm.entrypoints"]),
    ("apis", ["radixlm.entrypoints.http", "radixlm.entrypoints.native",
              "radixlm.entrypoints.openai", "radixlm.entrypoints.anthropic",
              "radixlm.entrypoints.ollama", "radixlm.entrypoints.playground"]),
    ("app", ["radixlm.entrypoints.http.server"]),
    ("tools", ["radixlm.cli", "radixlm.launch_server", "radixlm.bench"]),
]

# The upward imports that stay, each with its reason (docs/architecture.md lists them;
# tests/test_import_graph.py fails on any other, and on one listed here that is gone).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("radixlm.multimodal.onevision", "radixlm.models.llava"):
        "the OneVision prompt processor counts an image's tokens with the model class's "
        "own VisionSpec, so the processor and the model cannot disagree",
    ("radixlm.multimodal.onevision", "radixlm.models.registry"):
        "the same: it finds the model class of the served checkpoint",
}


def module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def imports_of(path: str, name: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported radixlm module, line) for every import in the file."""
    tree = ast.parse(open(path).read(), path)
    out: list[tuple[str, int]] = []
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("radixlm")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("radixlm"):
                continue
            # `from radixlm.x import y` imports module radixlm.x.y when y is a module (the
            # caller keeps the longest name that is one), else a name of radixlm.x.
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def floor_of(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def load(root: str) -> tuple[set[str], dict[str, list[tuple[str, int]]]]:
    modules: dict[str, str] = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                modules[module_name(root, path)] = path
    edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, path in modules.items():
        for target, line in imports_of(path, name, path.endswith("__init__.py")):
            # NOTE: the package's __init__ runs too, as for every import of a submodule,
            # and counts for none of them.
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges[name].append((target, line))
    return set(modules), edges


def circles(nodes: set[str], edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted({t for t, _ in edges.get(start, [])})))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({t for t, _ in edges.get(child, [])}))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "radixlm"))
    parser.add_argument("--edges", action="store_true", help="list every upward import")
    args = parser.parse_args()
    root = os.path.normpath(args.root)
    nodes, edges = load(root)
    unplaced = sorted(m for m in nodes if floor_of(m) < 0 and m != "radixlm")
    upward = sorted((src, dst, line) for src, targets in edges.items() for dst, line in set(targets)
                    if floor_of(src) >= 0 and floor_of(dst) > floor_of(src))
    found = circles(nodes, edges)
    print(f"{len(nodes)} modules, {sum(len(set(t)) for t in edges.values())} imports")
    print(f"circles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    print(f"upward imports: {len(upward)}")
    for src, dst, line in upward:
        if args.edges:
            print(f"  {src}:{line} -> {dst}")
    if not args.edges:
        pairs = sorted({(src, dst) for src, dst, _ in upward})
        for src, dst in pairs:
            mark = "  [allowed]" if (src, dst) in ALLOWED_UPWARD else ""
            print(f"  {src} ({FLOORS[floor_of(src)][0]}) -> {dst} ({FLOORS[floor_of(dst)][0]})"
                  f"{mark}")
    if unplaced:
        print(f"modules on no floor: {', '.join(unplaced)}")
    sys.exit(0)


if __name__ == "__main__":
    main()
