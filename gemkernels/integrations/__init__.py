"""GEM inside the frameworks agents are built on: one module per framework, each an extra of its own.

Each module imports its framework at the top, so ``import gemkernels`` never does; importing
``gemkernels.integrations.<framework>`` without the framework installed raises an ImportError that names the
``pip install 'gemkernels[<extra>]'`` to run.
"""
