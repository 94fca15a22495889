"""Container images pulled ahead of time into the pod VM's disk, and served back from it.

A warm VM pulls the pool's images once (`pull`) into a content-addressed store on its root
volume (`store`), which survives the stop; after the VM is adopted, a read-only registry mirror
on loopback (`mirror`) serves them to the image puller in the guest, which tries the mirror
before the image's own registry. A miss is a 404, so the puller falls back to the origin.

    reference   image names as Docker reads them (busybox -> docker.io/library/busybox:latest)
    store       blobs by digest, the references that name them, written atomically
    auth        docker-style credentials and the registry's authentication challenges
    registry    one registry's HTTP API: tokens, deadlines, size caps
    pull        an image (index, manifest, config, layers) into the store
    mirror      the store as a read-only OCI distribution API
"""
