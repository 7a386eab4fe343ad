"""Feature trials under faults: killed builders, a full disk, damaged blobs, concurrent builders."""
