"""The BMC source: IPMI (RMCP+) and Redfish through pyghmi, one session per BMC.

`source.py` runs it, `ipmi.py` and `redfish.py` speak the protocols, `sensors.py`
normalises what they read and adds up node totals, `sel.py` turns the event log into
hub events once.
"""

from gpuconsole.sources.bmc.link import BmcAuthError, BmcError, BmcLink, PowerAction
from gpuconsole.sources.bmc.source import BmcPool, BmcSource, BmcTarget, open_link, source_for

__all__ = [
    "BmcAuthError",
    "BmcError",
    "BmcLink",
    "BmcPool",
    "BmcSource",
    "BmcTarget",
    "PowerAction",
    "open_link",
    "source_for",
]
