"""One function over many inputs: plan (payload once), run (launch under a cap,
observe, retry, gather), resume, the typed state that crosses deferrals, child logs.
The top of core: uses jobs/ and everything below it.
"""
