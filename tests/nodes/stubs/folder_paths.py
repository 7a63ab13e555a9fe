"""Stand-in for ComfyUI's ``folder_paths``: model folder names -> (paths, extensions). Tests set the paths."""

folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {
    "diffusers": ([], {"folder"}),
    "diffusion_models": ([], set()),
}


def get_folder_paths(folder_name: str) -> list[str]:
    return list(folder_names_and_paths[folder_name][0])


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
