"""padoc-ray: PaDoc layout-fork document parsing at scale on Ray and vLLM."""

__version__ = "0.1.0"
