"""Layer 5, applications over contracts: the typed requests and results a contract's runner serves to the
command line (``etsdk export / generate / chat``)."""
