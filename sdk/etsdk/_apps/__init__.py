"""Layer 5, applications over contracts: the typed requests, results and runner protocol
(:class:`~etsdk._apps.generation.TextRunner`) that a contract's runner serves to the applications over it. The
applications themselves are plugin commands (etsdk-hf-static's ``etsdk export / generate / chat``)."""
