"""Image: the derived vLLM image with the chat patches, built on the box from a pinned base, once
per run.

The run's first host builds it (or holds it already). With image_registry set it pushes it and
the others pull it; without one (image_source, on with two or more boxes) the others load it from
that first host over SSH. Either way each box checks the image on arrival, a box that has it gets
nothing, and a box that cannot get it builds its own (a separate, later operation on each, so the
build comes first).
"""

from io import StringIO

from pyinfra import host, inventory, state
from pyinfra.api import deploy

from thorfleet.operations import files, image
from thorfleet.run import peers
from thorfleet.settings.layout import (
    BOX_ETC,
    BOX_IMAGE_CONTEXT,
    BOX_IMAGE_HOME,
    BOX_IMAGE_KEY,
    BOX_IMAGE_SUDOERS,
    BOX_IMAGE_TOOL,
    BOX_PEER_KNOWN_HOSTS,
    BOX_STATE,
    FILES,
    IMAGE_USER,
    THOR_FILES,
)


@deploy("Image")
def run(settings):
    context = f"{BOX_IMAGE_CONTEXT}/{settings.image_inputs_hash[:12]}"
    files.tree(name="Upload the image build context (Dockerfile, patches)",
               src=str(FILES / "image"), dest=context)
    copying = peers.image_copy(settings, inventory)
    if copying:
        image_access(settings)
    else:  # no copy between boxes: nobody may ask this box for its image
        files.absent(name="No image copy access (the copy is off)",
                     path=f"{BOX_IMAGE_HOME}/.ssh/authorized_keys")
        files.absent(name="No image copy rule (the copy is off)", path=BOX_IMAGE_SUDOERS)
        files.absent(name="No image copy key (the copy is off)", path=BOX_IMAGE_KEY)
    built_from = {"tag": settings.image_tag, "base": settings.image_base,
                  "inputs_hash": settings.image_inputs_hash,
                  "think_prefill": settings.image_think_prefill, "context": context}
    first = host.name == peers.first_of_run(inventory, state)
    if first or not (settings.image_registry or copying):
        image.derived_image(name=f"Build {settings.image_tag} unless it exists", **built_from,
                            registry=settings.image_registry,
                            shared_ref=settings.image_shared_ref, shared=copying)
    # Later lines: pyinfra runs an operation on every host in the order of the lines that call
    # it, so the first host's build (and push) above is done before any other host asks for it.
    elif settings.image_registry:
        image.shared_image(
            name=f"Pull {settings.image_tag} from {settings.image_registry} unless it exists",
            **built_from, registry=settings.image_registry, shared_ref=settings.image_shared_ref)
    else:
        source = peers.image_source_of(inventory, state)
        image.loaded_image(name=f"Load {settings.image_tag} from {source} unless it exists",
                           **built_from, source=source)


def image_access(settings):
    """What the boxes load the image with: a user whose one authorized key may only ask this box
    for a `docker save` of a derived image (thorfleet-image serve, then its save through the one
    sudo rule), and that key for this box's own loads."""
    private, public = peers.key_pair(settings.image_peer_key_file, IMAGE_USER)
    files.whole_file(name="Install the image copy tool", src=str(THOR_FILES / "bin" / "thorfleet-image"),
                     path=BOX_IMAGE_TOOL, mode="755")
    files.key_only_user(IMAGE_USER, BOX_IMAGE_HOME, public, f"{BOX_IMAGE_TOOL} serve",
                        "ask for a derived image")
    # sudo takes the rule only if visudo does: a broken file here would lock sudo out
    files.whole_file(name="Let the image user run the image tool's save as root, nothing else",
                     path=BOX_IMAGE_SUDOERS, mode="440", check=("visudo", "-c", "-q", "-f"),
                     src=StringIO(f"# Managed by thorfleet: the image copy (thorfleet-image)\n"
                                  f"{IMAGE_USER} ALL=(root) NOPASSWD: {BOX_IMAGE_TOOL} save *\n"))
    files.directory(name=f"Create {BOX_ETC}", path=BOX_ETC, mode="755")
    files.secret_file(name="Install the fleet's image key (root-only)", path=BOX_IMAGE_KEY,
                      src=StringIO(private))
    files.directory(name=f"Create {BOX_STATE}", path=BOX_STATE, mode="700")
    files.whole_file(name="Install the boxes' host keys for the copy (as the laptop knows them)",
                     path=BOX_PEER_KNOWN_HOSTS, src=StringIO(peers.peer_known_hosts(inventory)))
