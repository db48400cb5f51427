"""Files and live links of fitted ANNY bodies for the tools that use them (docs/body.md,
"Exports"): OpenSim .mot joint angles, BVH, glTF of the mesh, VMC over OSC. Plain functions
over arrays of BodyResult's kind (stages/body/result.py), usable outside the body stage.
"""
