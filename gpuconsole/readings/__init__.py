"""What sources report, one module per kind: frozen msgspec Structs, units in field names.

`snapshot.NodeSnapshot` carries one optional reading of each kind for a node.
"""
