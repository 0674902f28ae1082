"""Private cryptographic primitives of the bundle format.  Nothing outside `bundles` uses these."""
