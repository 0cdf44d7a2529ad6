"""Media from and to clients: wire audio formats and codecs, pictures, and a WebRTC call's camera."""
