#: The version of the installed etsdk distribution (``etsdk --version`` prints it).
__version__ = "0.1.0"
