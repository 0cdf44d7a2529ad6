"""Turn detection: when the user starts and stops speaking (server VAD), and the idle timeout."""
