"""Stand-in for ComfyUI's ``folder_paths``: model folder names -> (paths, extensions). Tests set the paths."""

import os

folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {
    "diffusers": ([], {"folder"}),
    "diffusion_models": ([], {".safetensors"}),
    "text_encoders": ([], {".safetensors"}),
    "vae": ([], {".safetensors"}),
}


def get_folder_paths(folder_name: str) -> list[str]:
    return list(folder_names_and_paths[folder_name][0])


def get_filename_list(folder_name: str) -> list[str]:
    """Files under the folder's paths (relative, '/'-separated, sorted), with one of its extensions."""
    paths, extensions = folder_names_and_paths[folder_name]
    out = set()
    for root in paths:
        for dirpath, _, filenames in os.walk(root, followlinks=True):
            for name in filenames:
                if os.path.splitext(name)[1] in extensions:
                    out.add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(out)


def get_full_path(folder_name: str, filename: str) -> str | None:
    for root in folder_names_and_paths[folder_name][0]:
        path = os.path.join(root, filename)
        if os.path.isfile(path):
            return path
    return None


user_directory = ""  # ComfyUI: <base>/user; tests set it


def get_user_directory() -> str:
    return user_directory


output_directory = ""  # ComfyUI: <base>/output; tests set it


def get_output_directory() -> str:
    return output_directory


def get_save_image_path(filename_prefix: str, output_dir: str, image_width: int = 0, image_height: int = 0):
    """(folder, name, counter, subfolder, prefix) as ComfyUI's: ``counter`` = 1 + the largest ``n`` of the files
    ``<name>_<n>_...`` in the folder (files where a word follows ``<name>_`` do not count)."""
    import os
    import re

    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    name = os.path.basename(os.path.normpath(filename_prefix))
    folder = os.path.join(output_dir, subfolder)
    if os.path.commonpath((output_dir, os.path.abspath(folder))) != output_dir:
        raise Exception("Saving image outside the output folder is not allowed.")  # ComfyUI raises a bare Exception
    found = os.listdir(folder) if os.path.isdir(folder) else []
    counters = [int(m.group(1)) for f in found if (m := re.fullmatch(re.escape(name) + r"_(\d+)_.*", f))]
    return folder, name, max(counters, default=0) + 1, subfolder, filename_prefix
