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
