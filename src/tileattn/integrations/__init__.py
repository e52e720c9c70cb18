"""Integrations with other libraries, each imported on demand (none is imported by `import tileattn`):

    tileattn.integrations.transformers   "tileattn" as a Hugging Face transformers attention implementation
"""
