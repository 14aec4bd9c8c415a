"""The server's packages import each other in one direction only: the graph of andrea's
top-level units (its subpackages and top-level modules, each edge an import anywhere inside
one of another) has no cycle, so each can be read, tested and changed standing on the ones
below it. grimp builds the import graph from the source, as import-linter does."""

from graphlib import CycleError, TopologicalSorter

import grimp


def unit_graph() -> dict[str, set[str]]:
    """{unit: the units it imports}, units being andrea.<name> (a package with what is inside
    it, or a module)."""
    graph = grimp.build_graph("andrea")
    unit = lambda module: module.split(".")[1]      # noqa: E731 (andrea.x.y -> x)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        if module.count(".") == 0:
            continue
        mine = edges.setdefault(unit(module), set())
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("andrea.") and unit(imported) != unit(module):
                mine.add(unit(imported))
    return edges


def test_the_package_graph_is_acyclic():
    edges = unit_graph()
    assert {"store", "web", "room", "runs", "data", "routes", "cli"} <= set(edges)
    try:
        order = list(TopologicalSorter(edges).static_order())
    except CycleError as e:
        cycle = e.args[1]
        raise AssertionError("an import cycle: " + " -> ".join(cycle)) from None
    print("\nfrom the bottom up:", " ".join(order))


def test_the_layers_the_issue_named_stay_apart():
    """What read as tangled: the store reaching into web/ for the token hash, room and runs
    importing each other, data's batch spec importing the room's shards."""
    edges = unit_graph()
    assert "web" not in edges["store"] and "room" not in edges["data"]
    assert not ("room" in edges["runs"] and "runs" in edges["room"])
    assert "routes" not in edges["store"] | edges["room"] | edges["runs"] | edges["data"]
    # A service is the domain's, whoever calls it: it knows no request, socket or route.
    assert not {"web", "routes", "telemetry"} & edges["services"]
