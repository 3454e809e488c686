"""The compiled engine core (nvshard/native.py): which modules run compiled,
the source winning over a stale build, and compiled plans equal to the
Python source's (the reference), logs included."""

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys

import pytest

from nvshard import native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PURE = os.environ.get(native.PURE_PYTHON_ENV, "") not in ("", "0")


def test_the_engine_modules_run_compiled_unless_asked_not_to():
    """tools/nvshard setup compiles them; NVSHARD_PURE_PYTHON=1 runs the source."""
    for module in native.COMPILED:
        path = importlib.import_module(module).__file__
        if PURE:
            assert path.endswith(".py"), f"{module} was imported from {path} with {native.PURE_PYTHON_ENV} set"
        else:
            assert not path.endswith(".py"), (
                f"{module} runs from its source ({native.status()[module]}); run tools/nvshard setup")


@pytest.mark.skipif(PURE, reason="the class directives only act on the compiled records")
def test_compiled_records_skip_the_cyclic_collector():
    """Records no cycle passes through are left out of the collector's scans:
    the directive is on the class in the .py (Cython ignores it in a .pxd)."""
    import gc

    from nvshard.preseg.cost import Cost
    from nvshard.preseg.log import Decision
    from nvshard.preseg.program import TvState
    from nvshard.preseg.proposals import propagated_through

    records = [TvState(None, [()]), Cost(symbolic=False), Decision(None, 0, (), None, 0, "annotation", ""),
               propagated_through(None, None, None, [])]
    assert [type(r).__name__ for r in records if gc.is_tracked(r)] == []


def test_python_directives_leave_classes_as_they_are():
    """Without Cython the records are the plain classes they are written as."""
    class Record:
        pass

    directives = native.PythonDirectives
    assert directives.no_gc(directives.freelist(8)(directives.cclass(Record))) is Record


def _fake_tree(tmp_path, built=True):
    """A package tree holding every compiled module's source, an extension
    file for each and the build manifest, as setup.py leaves them."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    manifest = {}
    for module in native.COMPILED:
        src = native.source_path(module, str(tmp_path))
        os.makedirs(os.path.dirname(src), exist_ok=True)
        with open(src, "w") as f:
            f.write(f"NAME = {module!r}\n")
        if built:
            open(src[: -len(".py")] + suffix, "w").close()
        manifest[module] = native.source_hash(src)
    with open(os.path.join(tmp_path, "nvshard", native.MANIFEST), "w") as f:
        json.dump(manifest, f)
    return tmp_path


def test_status_runs_the_source_when_the_build_is_stale_missing_or_unwanted(tmp_path):
    root = str(_fake_tree(tmp_path))
    assert set(native.status(root, environ={}).values()) == {"compiled"}

    # a .pxd beside a module is part of what was compiled (its field and local types)
    typed = native.COMPILED[2]
    with open(native.source_path(typed, root)[: -len(".py")] + ".pxd", "w") as f:
        f.write("cdef class Record:\n    cdef public object field\n")
    status = native.status(root, environ={})
    assert "older than the source" in status[typed]
    # the modules run as one unit: the others run from source with it
    assert all(status[m] == f"source (runs with {typed}, which runs from its source)"
               for m in native.COMPILED if m != typed)
    os.remove(native.source_path(typed, root)[: -len(".py")] + ".pxd")
    assert set(native.status(root, environ={}).values()) == {"compiled"}

    edited = native.COMPILED[0]
    with open(native.source_path(edited, root), "a") as f:
        f.write("# an edit after the build\n")
    status = native.status(root, environ={})
    assert "older than the source" in status[edited]
    assert all("runs from its source" in status[m] for m in native.COMPILED[1:])

    os.remove(native.compiled_path(native.COMPILED[1], root))
    assert "not compiled" in native.status(root, environ={})[native.COMPILED[1]]

    pure = native.status(root, environ={native.PURE_PYTHON_ENV: "1"})
    assert all(native.PURE_PYTHON_ENV in why for why in pure.values())


def test_check_fails_only_on_a_stale_build(tmp_path, monkeypatch):
    """tools/nvshard setup rebuilds when `native.py --check` fails; the script
    runs without importing nvshard (or torch)."""
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)  # (set, nothing runs compiled: nothing is stale)
    root = str(_fake_tree(tmp_path))
    assert native._main(["--check"], root) == 0
    os.remove(native.compiled_path(native.COMPILED[1], root))
    assert native._main(["--check"], root) == 0  # not compiled is not stale: nothing to rebuild
    with open(native.source_path(native.COMPILED[0], root), "a") as f:
        f.write("# edited\n")
    assert native._main(["--check"], root) == 1

    listing = subprocess.run([sys.executable, "-X", "importtime", os.path.join(ROOT, "nvshard", "native.py")],
                             capture_output=True, text=True)
    assert listing.returncode == 0 and native.COMPILED[0] in listing.stdout
    assert " torch" not in listing.stderr and "nvshard." not in listing.stderr


@pytest.mark.skipif(PURE, reason="compares the compiled engine with its source; here both are the source")
def test_compiled_and_python_engines_give_the_same_plans_and_logs():
    """The programs tools/bench_propagation.py times (the triangle update,
    transformer stacks with TP and SP, MLP and triangle stacks, two layers
    each) planned by the compiled modules and by their Python source: the
    same decision log (conflicts with every candidate's cost included) and
    the same communications. CI's plan census compares 114 more programs."""
    script = ("import json, sys\n"
              "sys.path.insert(0, 'tools')\n"
              "import nvshard, bench_propagation as bp\n"
              "out = {'triangle update': bp.triangle_single()}\n"
              "out.update({family: build(2) for family, build in bp.FAMILIES.items()})\n"
              "for name, (fd, shapes) in out.items():\n"
              "    plan = nvshard.propagate_shardings(fd, shapes, propagation='default')\n"
              "    out[name] = plan.log.text() + '\\n' + plan.report()\n"
              "print(json.dumps(out))\n")
    runs = []
    for pure in ("", "1"):
        env = dict(os.environ, **{native.PURE_PYTHON_ENV: pure})
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout))
    compiled, python = runs
    assert sorted(compiled) == sorted(python) and len(python) == 5
    assert sum("conflict at" in text for text in python.values()) >= 3  # the logs hold real decisions
    for name in python:
        assert compiled[name] == python[name], name


@pytest.mark.skipif(PURE, reason="compares the compiled engine with its source; here both are the source")
def test_structural_keys_are_the_same_compiled_and_as_source():
    """The keys that order conflicts are 64-bit hashes: C integers compiled,
    masked Python integers in the source; they must agree bit for bit."""
    import importlib.util

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import bench_propagation as bp
    finally:
        sys.path.pop(0)
    from nvshard.preseg import engine
    from nvshard.preseg.pipeline import _sizes
    from nvshard.preseg.program import Program

    spec = importlib.util.spec_from_file_location("nvshard.preseg._engine_source",
                                                  os.path.join(ROOT, "nvshard", "preseg", "engine.py"))
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    assert not engine.__file__.endswith(".py") and source.__file__.endswith(".py")
    fd, shapes = bp.FAMILIES["triangle"](2)
    program = Program(fd.fusion, _sizes(fd.fusion, shapes, None))
    depth, canon = engine._structure(program)
    assert (depth, canon) == source._structure(program)
    # (equal structure, equal key: the same op on the same tensors)
    assert len(set(canon.values())) > 100 and 2**63 <= max(canon.values()) < 2**64
