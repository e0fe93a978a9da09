"""Actions that change the world: who may act (roles), what they asked (audit), and the
actions themselves (power). The reassign issue grows this into plans of journaled steps.
"""
