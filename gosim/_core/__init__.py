"""The self-contained core of gosim: scheduler, G records, timers, trace, errors.

Imports only the standard library and trio (plus trio's ``outcome``). Everything above
it (channels, select, time, sync, net) uses it through :mod:`gosim.lowlevel`.
"""
