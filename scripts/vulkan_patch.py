"""Guard ggml-vulkan.cpp's VK_EXT_layer_settings block for Vulkan headers older than 1.3.261 (Debian 12's), in the
sdist scripts/build-vulkan builds: python scripts/vulkan_patch.py PATH/ggml-vulkan.cpp"""
import re
import sys

path = sys.argv[1]
text = open(path, encoding="utf-8").read()
# the block that builds the validation layer's settings, up to the InstanceCreateInfo that chains them
m = re.search(r"\n(\s*)VkBool32 enable_best_practice = layer_settings;\n.*?&layer_setting_info\);\n", text, re.S)
if m is None or "VK_HEADER_VERSION >= 261" in text:
    sys.exit(0)  # a newer llama.cpp, or already patched
indent = m.group(1)
block = m.group(0)
plain = f"{indent}vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{{}}, &app_info, layers, extensions);\n"
text = text.replace(block, f"\n#if VK_HEADER_VERSION >= 261{block}#else\n{plain}#endif\n", 1)
open(path, "w", encoding="utf-8").write(text)
print("guarded VK_EXT_layer_settings for Vulkan headers older than 1.3.261", file=sys.stderr)
