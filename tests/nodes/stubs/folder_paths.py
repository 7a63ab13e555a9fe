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
