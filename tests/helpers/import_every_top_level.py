"""Run inside an image: import every top-level module of every installed distribution (read from each
one's RECORD, as installed); prints the count of modules and distributions, then one line per failure."""
import importlib, importlib.metadata as md, sys
site = [p for p in sys.path if p.endswith("site-packages")][0]
tops = {}
for d in md.distributions(path=[site]):
    names = set()
    for f in d.files or []:
        parts = f.parts
        if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "__pycache__"):
            continue
        first = parts[0]
        if first.endswith(".py"):
            names.add(first[:-3])
        elif len(parts) > 1 and (parts[-1] == "__init__.py"):
            names.add(first)
        elif first.endswith(".so") and "." in first:
            names.add(first.split(".")[0])
        elif len(parts) > 1 and parts[-1].endswith((".py", ".so")):
            names.add(first)  # namespace package
    tops[d.metadata["Name"]] = sorted(n for n in names if n.isidentifier())
bad = []
n = 0
for dist, names in sorted(tops.items()):
    for name in names:
        n += 1
        try:
            importlib.import_module(name)
        except Exception as e:
            bad.append(f"{dist}:{name}: {type(e).__name__}: {str(e)[:100]}")
print(n, len(tops))
print("\n".join(bad))
