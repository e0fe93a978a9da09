"""The ssh-in console: an asyncssh server, a Textual driver over its channels, and keys."""
