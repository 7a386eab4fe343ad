"""What the tests share, imported by name (``from tests.helpers.cli import run_cli``), never from a conftest nor
from another test file: the CLI run as a user runs it (:mod:`.cli`), small projects (:mod:`.projects`), a real
S3 endpoint (:mod:`.s3`), Dask processes (:mod:`.daskkit`), headless Chromium (:mod:`.chromium`), the TCP fault
proxy (:mod:`.proxy`) and the fault-injection kit (:mod:`.faultkit`), store and release fixtures' building
blocks (:mod:`.store`, :mod:`.releases`), the runtime's stand-ins (:mod:`.runtime`), NEFF files (:mod:`.neff`),
tiny causal LMs (:mod:`.textgen`) and golden CLI outputs (:mod:`.golden`)."""
