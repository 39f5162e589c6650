"""The model worker process: the only part of hotreload that imports torch."""
