"""`peerpods podvm pull-images` and `peerpods podvm image-mirror`: images pulled ahead of time.

`pull-images` pulls each image into the image store (one line per image on stdout); exit 0 when
every image was pulled, 1 when one failed (the others are still pulled), 2 on bad input (an
invalid reference, an unreadable images or auth file), before anything is fetched or written.
`image-mirror` serves the store on loopback as a read-only registry mirror until stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from adaptor.cli import flags

if TYPE_CHECKING:
    from adaptor.podvm.imagecache.reference import ImageReference

_MAX_IMAGES_FILE_BYTES = 1 << 20


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pull-images` and `image-mirror` to `peerpods podvm`."""
    from adaptor.cli.settings import PodvmImageMirrorSettings, PodvmPullImagesSettings

    pull = sub.add_parser(
        "pull-images",
        help="pull container images into the pod VM's image store",
        description="Pull container images over the registry API into the image store, kept "
        "on the VM's root volume. Exit status: 0 every image pulled; 1 one failed (one line "
        "each says why; the others are pulled); 2 bad input, nothing fetched.",
    )
    pull.add_argument("images", nargs="*", metavar="IMAGE", help="image references")
    flags.add_settings(pull, PodvmPullImagesSettings)
    mirror = sub.add_parser(
        "image-mirror",
        help="serve the image store as a read-only registry mirror on loopback",
        description="Serve the image store as a read-only OCI registry mirror: the first path "
        "component after /v2/ names the upstream registry (mirror location "
        "127.0.0.1:5170/docker.io); images not stored are 404, so pullers fall back to the "
        "origin. Runs until SIGTERM or SIGINT.",
    )
    flags.add_settings(mirror, PodvmImageMirrorSettings)


def run(args: argparse.Namespace) -> int:
    if args.podvm_command == "pull-images":
        return _pull(args)
    return _mirror(args)


def _pull(args: argparse.Namespace) -> int:
    from adaptor.cli.settings import PodvmPullImagesSettings
    from adaptor.podvm.imagecache.auth import load_auth_file
    from adaptor.podvm.imagecache.manifest import Platform
    from adaptor.podvm.imagecache.pull import PullOptions, pull_images
    from adaptor.podvm.imagecache.registry import Limits
    from adaptor.podvm.imagecache.store import ImageStore
    from providers.core.errors import InvalidRequest

    settings = flags.section(PodvmPullImagesSettings, args)
    refs = _references(args.images, settings.images_file)
    try:
        platform = Platform.parse(settings.platform)
    except ValueError as exc:
        raise InvalidRequest(f"--platform: {exc}") from None
    credentials = load_auth_file(Path(settings.auth)) if settings.auth else {}
    options = PullOptions(
        platform=platform,
        credentials=credentials,
        plain_http=frozenset(settings.plain_http),
        limits=Limits(
            request_seconds=settings.request_timeout_seconds,
            blob_seconds=settings.blob_timeout_seconds,
        ),
    )
    store = ImageStore(Path(settings.store), max_blob_bytes=settings.max_blob_mib << 20)
    results = pull_images(refs, store, options, report=lambda r: print(r.summary(), flush=True))
    failed = [r for r in results if not r.ok]
    if failed:
        print(
            f"peerpods podvm pull-images: {len(failed)} of {len(results)} images failed",
            file=sys.stderr,
        )
        return 1
    return 0


def _references(images: list[str], images_file: str) -> list[ImageReference]:
    """Every image named, parsed before anything is fetched (a bad one is exit 2)."""
    from adaptor.podvm.imagecache.reference import parse
    from providers.core.errors import InvalidRequest

    texts = list(images)
    if images_file:
        texts += _read_images_file(Path(images_file))
    if not texts:
        raise InvalidRequest("no images given (IMAGE arguments or --images-file)")
    refs = [parse(text) for text in texts]
    return list(dict.fromkeys(refs))


def _read_images_file(path: Path) -> list[str]:
    from providers.core.errors import InvalidRequest

    try:
        with path.open("rb") as stream:
            data = stream.read(_MAX_IMAGES_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as exc:
        raise InvalidRequest(f"--images-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequest(f"--images-file {path}: not UTF-8 text") from None
    if len(data) > _MAX_IMAGES_FILE_BYTES:
        raise InvalidRequest(f"--images-file {path}: larger than 1 MiB")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def _mirror(args: argparse.Namespace) -> int:
    from adaptor.cli.settings import PodvmImageMirrorSettings
    from adaptor.podvm.imagecache.mirror import parse_listen, serve
    from adaptor.podvm.imagecache.store import ImageStore

    settings = flags.section(PodvmImageMirrorSettings, args)
    parse_listen(settings.listen, allow_remote=settings.allow_remote)  # before the store
    store = ImageStore(Path(settings.store))
    serve(store, settings.listen, allow_remote=settings.allow_remote)
    return 0
