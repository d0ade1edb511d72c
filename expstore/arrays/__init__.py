"""Arrays stored once: content-addressed by digest, with the buffer's compression setting
per payload path (stored_once)."""
